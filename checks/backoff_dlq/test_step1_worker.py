"""Step 1: worker.py consumes q:tasks and passes each decoded message to process(msg)."""
import pytest

from retrylab import runreport
from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.stored_values import shorten
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.step(1)


def test_every_message_reaches_process_once(worker_run, request):
    run = worker_run.run
    runreport.attach_runs(request.node, run)
    observe.require_script(run, "worker.py")
    observe.require_honest_calls(run, worker_run.seeded)
    if not run.calls:
        fail(tr("step1.never_called", how=runreport.how_it_ran(run)))

    seeded = {m["id"]: m for m in worker_run.seeded}
    for call in run.calls:
        if call.id not in seeded:
            fail(tr("step1.not_queued", arg=shorten(call.arg)))
        problem = observe.call_fields_problem(call.arg, seeded[call.id])
        if problem:
            fail(problem)

    counts = worker_run.call_counts()
    goods = worker_run.goods
    missing = [m for m in goods if counts[m["id"]] == 0]
    if missing:
        fail(tr("step1.goods_missing", missing=len(missing), total=len(goods), id=missing[0]["id"],
                how=runreport.how_it_ran(run)))
    twice = [m for m in goods if counts[m["id"]] > 1]
    if twice:
        fail(tr("step1.good_twice", id=twice[0]["id"], count=counts[twice[0]["id"]]))
    if counts[worker_run.bad["id"]] == 0:
        fail(tr("step1.bad_never"))
