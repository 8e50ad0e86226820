"""Advanced: a DLQ service started only after the poison used up its deliveries still dead-letters it,
exactly once (run_late_service.py: worker.py alone until the advisory, then dlq_service.py). Advisories are
core NATS messages, lost when nobody listens: the service must read them from a stream that captured them,
or reconcile from the stream and the consumer when it starts."""
import pytest

from retrylab import runreport
from retrylab.checks.jetstream_dlq import dead_letters, lab, observe
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.fixtures.jetstream_dlq import events
from retrylab.verdict import fail

pytestmark = pytest.mark.advanced("late-dlq-service")


def test_a_service_started_late_dead_letters_the_poison_once(late_service_run, request):
    run = late_service_run
    runreport.attach_runs(request.node, run.worker, run.service)
    observe.require_script(run.worker, "worker.py")
    if not run.has_service:
        fail(tr("advanced_msg.late-dlq-service.no_service"))
    if run.advised_at is None:
        fail(tr("advanced_msg.late-dlq-service.no_advisory", advisory=lab.MAX_DELIVERIES_ADVISORY,
                how=runreport.how_it_ran(run.worker)))
    poison = next(e for e in run.published if e["kind"] == "poison")
    payload = events.payload(poison)
    stored = dead_letters.under(run.dlq, lab.DLQ_SUBJECT)
    copies = [m for m in stored if m["data"] == payload]
    if not copies and stored:
        fail(tr("advanced_msg.late-dlq-service.other", subject=lab.DLQ_SUBJECT,
                data=dead_letters.shown(stored[0]["data"])))
    published = dead_letters.published_on(lab.DLQ_SUBJECT, run.service)
    if not copies and published:
        fail(tr("advanced_msg.late-dlq-service.not_stored", subject=lab.DLQ_SUBJECT, count=published,
                stream=lab.DLQ_STREAM))
    if not copies:
        fail(tr("advanced_msg.late-dlq-service.missed", subject=lab.DLQ_SUBJECT, how=runreport.how_it_ran(run.service)))
    if len(copies) > 1:
        fail(tr("advanced_msg.late-dlq-service.duplicates", subject=lab.DLQ_SUBJECT, count=len(copies),
                ids=", ".join(dead_letters.msg_id(m) or "-" for m in copies)))
