"""Step 4: the poison (TemporaryError every time) is delivered exactly 3 times (delivery counts 1, 2, 3 on the
relay), never acked nor terminated, and each redelivery comes at least MIN_REDELIVERY_GAP after the one before
(real time on the relay: BackOff's waits, or nak(delay=...); a plain nak() redelivers at once)."""
import pytest

from retrylab import runreport
from retrylab.checks.jetstream_dlq import deliveries, lab, observe
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.step(4)


def test_poison_delivered_three_times_paced(main_run, request):
    runreport.attach_runs(request.node, main_run.worker)
    found = observe.worker_deliveries(main_run)
    observe.require_explicit_acks(main_run)
    seq = main_run.seqs[main_run.event("poison")["id"]]
    own = deliveries.of_seq(found, seq)
    if not own:
        fail(tr("step4.not_delivered", seq=seq, how=runreport.how_it_ran(main_run.worker)))
    answers = deliveries.answers_to(main_run.answered(), own)
    kinds = [a.kind for a in answers]
    if deliveries.ACK in kinds:
        fail(tr("step4.acked", seq=seq, count=len(own)))
    if deliveries.TERM in kinds:
        fail(tr("step4.terminated", seq=seq, count=len(own)))
    for number, gap in enumerate(deliveries.gaps(own), 2):
        if gap < lab.MIN_REDELIVERY_GAP:
            plain_nak = any(a.kind == deliveries.NAK and a.delay is None for a in answers)
            fail(tr("step4.plain_nak" if plain_nak else "step4.too_soon", seq=seq, number=number,
                    gap=f"{gap:.2f}", least=lab.MIN_REDELIVERY_GAP))
    counts = [d.delivered for d in own]
    if max(counts) > lab.MAX_DELIVER:
        fail(tr("step4.beyond_max", seq=seq, count=max(counts), most=lab.MAX_DELIVER))
    if counts != list(range(1, lab.MAX_DELIVER + 1)):
        fail(tr("step4.not_three", seq=seq, count=len(own), counts=", ".join(map(str, counts)),
                answers=", ".join(kinds) or "-", how=runreport.how_it_ran(main_run.worker)))
