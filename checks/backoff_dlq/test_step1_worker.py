"""Step 1: worker.py consumes q:tasks and passes each decoded message to process(msg)."""
import pytest

from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.messages import shorten
from retrylab.verdict import fail

pytestmark = pytest.mark.step(1)


def test_every_message_reaches_process_once(worker_run, request):
    run = worker_run.run
    observe.attach(request.node, run)
    observe.require_script(run, "worker.py")
    if not run.calls:
        fail(f"process(msg) was never called. {observe.how_it_ran(run)}")

    seeded = {m["id"]: m for m in worker_run.seeded}
    for call in run.calls:
        if call.id not in seeded:
            fail(f"process received something that is not one of the queued messages: {shorten(call.arg)}")
        problem = observe.call_fields_problem(call.arg, seeded[call.id])
        if problem:
            fail(problem)

    counts = worker_run.call_counts()
    goods = worker_run.goods
    missing = [m for m in goods if counts[m["id"]] == 0]
    if missing:
        why = observe.how_it_ran(run)
        fail(f"{len(missing)} of the {len(goods)} good messages never reached process (e.g. id {missing[0]['id']}). "
             f"They were queued behind a message whose process call raised; the worker must catch that "
             f"and carry on. {why}")
    twice = [m for m in goods if counts[m["id"]] > 1]
    if twice:
        fail(f"good message {twice[0]['id']} was passed to process {counts[twice[0]['id']]} times; "
             f"each message must be processed exactly once (take it off the queue, then process it).")
    if counts[worker_run.bad["id"]] == 0:
        fail("the failing message (kind=bad) never reached process; every message on q:tasks must be processed.")
