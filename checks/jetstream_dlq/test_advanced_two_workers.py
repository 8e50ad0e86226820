"""Advanced: two worker.py processes on one consumer process each good event once across both, and ack it
(run_two_workers.py: the two runs share one TaskprocApp; their call logs are merged here)."""
import pytest

from retrylab import runreport
from retrylab.checks.jetstream_dlq import deliveries, lab, observe
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.advanced("two-workers")


def _acked_seqs(run) -> set[int]:
    found = set()
    for worker in run.workers:
        for answer in deliveries.answers(worker.commands):
            meta = deliveries.metadata(answer.reply)
            if answer.kind == deliveries.ACK and meta is not None and meta.stream == lab.STREAM:
                found.add(meta.sequence.stream)
    return found


def test_two_workers_process_each_good_event_once(two_workers_run, request):
    run = two_workers_run
    runreport.attach_runs(request.node, *run.workers)
    observe.require_script(run.workers[0], "worker.py")
    for worker in run.workers:
        observe.require_honest_calls(worker)
        if worker.result.crashed:
            fail(tr("advanced_msg.two-workers.crashed", how=runreport.how_it_ran(worker)))
    counts = run.call_counts()
    twice = [(e["id"], counts[e["id"]]) for e in run.published if counts[e["id"]] > 1]
    if twice:
        fail(tr("advanced_msg.two-workers.twice", count=len(twice), total=len(run.published),
                example=twice[0][0], calls=twice[0][1], consumer=lab.CONSUMER))
    missed = [e["id"] for e in run.published if not counts[e["id"]]]
    if missed:
        fail(tr("advanced_msg.two-workers.missed", count=len(missed), total=len(run.published),
                how="\n".join(runreport.how_it_ran(w) for w in run.workers)))
    acked = _acked_seqs(run)
    unacked = [e["id"] for e in run.published if run.seqs[e["id"]] not in acked]
    if unacked:
        fail(tr("advanced_msg.two-workers.unacked", count=len(unacked), total=len(run.published)))
