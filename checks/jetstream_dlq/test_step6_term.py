"""Step 6: the corrupt event (PermanentError) is delivered once and answered with term(): never redelivered,
and no MAX_DELIVERIES advisory names it (MainRun.advisories: every advisory the server published)."""
import pytest

from retrylab import runreport
from retrylab.checks.jetstream_dlq import deliveries, lab, observe
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.step(6)


def test_corrupt_event_terminated_once(main_run, request):
    runreport.attach_runs(request.node, main_run.worker)
    found = observe.worker_deliveries(main_run)
    if main_run.ack_policy() == "none":     # every answer is ignored: no redelivery proves nothing
        fail(tr("deliveries.ack_none", consumer=lab.CONSUMER))
    corrupt = main_run.event("corrupt")
    seq = main_run.seqs[corrupt["id"]]
    own = deliveries.of_seq(found, seq)
    if not own:
        fail(tr("step6.not_delivered", seq=seq, how=runreport.how_it_ran(main_run.worker)))
    kinds = [a.kind for a in deliveries.answers_to(main_run.answered(), own)]
    if not any(c.outcome == "error" for c in main_run.calls_for(corrupt)):
        fail(tr("step6.not_processed", seq=seq))
    answers = ", ".join(kinds) or "-"
    if len(own) > 1:
        fail(tr("step6.redelivered", seq=seq, count=len(own), answers=answers))
    if deliveries.TERM not in kinds:
        fail(tr("step6.not_terminated", seq=seq, answers=answers))
    if main_run.advisories_for("MAX_DELIVERIES", seq):
        fail(tr("step6.advisory", seq=seq))
