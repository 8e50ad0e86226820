"""Step 7: the consumer ends with nothing pending and nothing unacknowledged; the poison is still in EVENTS."""
import pytest

from retrylab import runreport
from retrylab.checks.jetstream_dlq import lab, observe
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.fixtures.jetstream_dlq import events
from retrylab.verdict import fail

pytestmark = pytest.mark.step(7)


def test_nothing_pending_and_the_poison_kept(main_run, request):
    runreport.attach_runs(request.node, main_run.worker, main_run.dlq_service)
    observe.require_script(main_run.worker, "worker.py")
    info = main_run.consumer
    if lab.STREAM not in main_run.streams:
        fail(tr("step7.no_stream", stream=lab.STREAM, how=runreport.how_it_ran(main_run.worker)))
    if info is None:
        fail(tr("step7.no_consumer", consumer=lab.CONSUMER, how=runreport.how_it_ran(main_run.worker)))
    pending, unacked = info.get("num_pending", 0), info.get("num_ack_pending", 0)
    others = sorted({d.consumer for d in main_run.delivered()} - {lab.CONSUMER})
    if (pending or unacked) and others:     # the worker read another consumer: this one was never drained
        fail(tr("deliveries.other_consumer", consumers=", ".join(others), consumer=lab.CONSUMER, stream=lab.STREAM))
    if pending or unacked:
        fail(tr("step7.not_clean", pending=pending, unacked=unacked, how=runreport.how_it_ran(main_run.worker)))
    poison = main_run.event("poison")
    seq = main_run.seqs[poison["id"]]
    kept = next((m for m in main_run.events_left if m["seq"] == seq), None)
    if kept is None or kept["data"] != events.payload(poison):
        fail(tr("step7.poison_gone", seq=seq, stream=lab.STREAM))
