"""Step 3: each good event is processed exactly once and acked, and never delivered again.

Acks are judged from what the worker published on its deliveries' `$JS.ACK...` reply subjects (the relay's
record), not from the consumer's ack floor: the poison, never acked, keeps the floor below the goods after it.
"""
import pytest

from retrylab import runreport
from retrylab.checks.jetstream_dlq import deliveries, observe
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.step(3)


def test_each_good_event_processed_once_and_acked(main_run, request):
    runreport.attach_runs(request.node, main_run.worker)
    found = observe.worker_deliveries(main_run)
    observe.require_explicit_acks(main_run)
    answered = main_run.answered()
    goods = [e for e in main_run.published if e["kind"] == "good"]
    for number, good in enumerate(goods, 1):
        seq = main_run.seqs[good["id"]]
        calls = [c for c in main_run.calls_for(good) if c.outcome == "ok"]
        own = deliveries.of_seq(found, seq)
        if not own:
            fail(tr("step3.not_delivered", number=number, seq=seq, how=runreport.how_it_ran(main_run.worker)))
        if not calls:
            fail(tr("step3.not_processed", number=number, seq=seq, how=runreport.how_it_ran(main_run.worker)))
        given = deliveries.answers_to(answered, own)
        answers = ", ".join(a.kind for a in given) or "-"
        if len(calls) > 1:
            fail(tr("step3.processed_twice", number=number, seq=seq, count=len(calls), deliveries=len(own),
                    answers=answers))
        if any(d.delivered > 1 for d in own):
            fail(tr("step3.redelivered", number=number, seq=seq, delivered=max(d.delivered for d in own),
                    answers=answers))
        acks = [a for a in given if a.kind == deliveries.ACK]
        if not acks:
            fail(tr("step3.not_acked", number=number, seq=seq, answers=answers))
        # the call's real time (t - offset) is when it reached the harness, before process() returned and so
        # before any ack sent after it: an ack the relay read earlier was sent before processing
        if acks[0].at < calls[0].t - (calls[0].offset or 0.0):
            fail(tr("step3.acked_before", number=number, seq=seq))
