"""Step 6: after 5 (lab.MAX_ATTEMPTS) failures the message goes to q:tasks:dlq; q:tasks ends empty."""
import pytest

from retrylab import runreport
from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.settling import RETRIES_FOREVER
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.checks.backoff_dlq.lab import DLQ, MAX_ATTEMPTS, QUEUE
from retrylab.verdict import fail

pytestmark = pytest.mark.step(6)


def test_fifth_failure_moves_the_message_to_the_dlq(worker_run, request):
    run = worker_run.run
    runreport.attach_runs(request.node, run)
    observe.require_script(run, "worker.py")
    observe.require_honest_calls(run, worker_run.seeded)
    bad_id = worker_run.bad["id"]
    calls = len(worker_run.calls_for(worker_run.bad))
    dlq = worker_run.dlq
    if dlq is not None and dlq.type != "list":
        fail(tr("step6.dlq_not_list", dlq=DLQ, type=dlq.type))
    holding = [e for e in observe.dlq_entries(dlq) if bad_id.encode() in e]
    if not holding:
        key = "step6.never_in_dlq_forever" if calls > RETRIES_FOREVER else "step6.never_in_dlq"
        fail(tr(key, dlq=DLQ, calls=calls, how=runreport.how_it_ran(run)))
    if calls != MAX_ATTEMPTS:
        fail(tr("step6.wrong_calls", calls=calls))
    if worker_run.queue is not None and worker_run.queue.length:
        fail(tr("step6.queue_not_empty", queue=QUEUE, length=worker_run.queue.length))
    if dlq.length != 1:
        fail(tr("step6.dlq_length", dlq=DLQ, length=dlq.length))
    counts = worker_run.call_counts()
    for good in worker_run.goods:
        if counts[good["id"]] != 1:
            fail(tr("step6.good_count", id=good["id"], count=counts[good["id"]]))
