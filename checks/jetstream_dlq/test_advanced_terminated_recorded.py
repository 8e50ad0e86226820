"""Advanced: the corrupt event, terminated by the worker, is recorded under dlq.terminated (the original
payload byte for byte, with a Nats-Msg-Id of its own), never under dlq.events (read from the main run)."""
import pytest

from retrylab import runreport
from retrylab.checks.jetstream_dlq import dead_letters, lab, observe
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.fixtures.jetstream_dlq import events
from retrylab.verdict import fail

pytestmark = pytest.mark.advanced("terminated-recorded")


def test_the_terminated_event_is_recorded_under_dlq_terminated(main_run, request):
    run = main_run
    runreport.attach_runs(request.node, run.worker, run.dlq_service)
    observe.require_script(run.worker, "worker.py")
    corrupt = run.event("corrupt")
    seq, payload = run.seqs[corrupt["id"]], events.payload(corrupt)
    if dead_letters.about(run.advisories, lab.TERMINATED_ADVISORY, seq) is None:
        fail(tr("advanced_msg.terminated-recorded.not_terminated", seq=seq, advisory=lab.TERMINATED_ADVISORY))
    if any(m["data"] == payload for m in dead_letters.under(run.dlq, lab.DLQ_SUBJECT)):
        fail(tr("advanced_msg.terminated-recorded.under_dlq_events", events=lab.DLQ_SUBJECT,
                terminated=lab.TERMINATED_SUBJECT))
    recorded = dead_letters.under(run.dlq, lab.TERMINATED_SUBJECT)
    copies = [m for m in recorded if m["data"] == payload]
    if not copies:
        published = dead_letters.published_on(lab.TERMINATED_SUBJECT, run.worker, run.dlq_service)
        if recorded:
            why = tr("advanced_msg.terminated-recorded.other", data=dead_letters.shown(recorded[0]["data"]))
        elif published:
            why = tr("advanced_msg.terminated-recorded.not_stored", count=published, subject=lab.TERMINATED_SUBJECT,
                     stream=lab.DLQ_STREAM)
        elif not dead_letters.listens_for(lab.TERMINATED_ADVISORY, (run.setup,), (run.worker, run.dlq_service)):
            why = tr("advanced_msg.terminated-recorded.not_listening", advisory=lab.TERMINATED_ADVISORY)
        else:
            why = tr("advanced_msg.terminated-recorded.nothing")
        fail(tr("advanced_msg.terminated-recorded.missing", subject=lab.TERMINATED_SUBJECT, stream=lab.DLQ_STREAM,
                why=why))
    if len(copies) > 1:
        fail(tr("advanced_msg.terminated-recorded.duplicates", subject=lab.TERMINATED_SUBJECT, count=len(copies)))
    own = dead_letters.msg_id(copies[0])
    if not own:
        fail(tr("advanced_msg.terminated-recorded.no_msg_id", header=lab.MSG_ID_HEADER, seq=seq))
    if own in {dead_letters.msg_id(m) for m in dead_letters.under(run.dlq, lab.DLQ_SUBJECT)}:
        fail(tr("advanced_msg.terminated-recorded.shared_msg_id", header=lab.MSG_ID_HEADER, id=own, seq=seq,
                events=lab.DLQ_SUBJECT))
