"""Step 6: after 5 failures the message goes to q:tasks:dlq; q:tasks ends empty."""
import pytest

from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.conftest import RETRIES_FOREVER
from retrylab.fixtures.messages import DLQ, QUEUE
from retrylab.verdict import fail

pytestmark = pytest.mark.step(6)


def test_fifth_failure_moves_the_message_to_the_dlq(worker_run, request):
    run = worker_run.run
    observe.attach(request.node, run)
    observe.require_script(run, "worker.py")
    bad_id = worker_run.bad["id"]
    calls = len(worker_run.calls_for(worker_run.bad))
    dlq = worker_run.dlq
    if dlq is not None and dlq.type != "list":
        fail(f"{DLQ} is a Redis {dlq.type}; the DLQ must be a list (LPUSH/RPUSH the entry).")
    holding = [e for e in observe.dlq_entries(dlq) if bad_id.encode() in e]
    if not holding:
        forever = " - the worker seems to retry forever" if calls > RETRIES_FOREVER else ""
        fail(f"the failing message never reached {DLQ}: process was called {calls} time(s) for it{forever}. "
             f"{observe.how_it_ran(run)}")
    if calls != 5:
        fail(f"process was called {calls} time(s) for the failing message before it went to the DLQ; "
             f"it must be tried exactly 5 times.")
    if worker_run.queue is not None and worker_run.queue.length:
        fail(f"{QUEUE} still holds {worker_run.queue.length} message(s) after the run; "
             f"a message that went to the DLQ must leave the main queue.")
    if dlq.length != 1:
        fail(f"{DLQ} holds {dlq.length} entries; only the failing message belongs there.")
    counts = worker_run.call_counts()
    for good in worker_run.goods:
        if counts[good["id"]] != 1:
            fail(f"good message {good['id']} was processed {counts[good['id']]} time(s) while the failing one "
                 f"was retried; the others must be processed exactly once.")
