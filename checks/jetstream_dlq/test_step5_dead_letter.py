"""Step 5: after the poison's MAX_DELIVERIES advisory, dlq.events holds exactly one message: the poison's
original payload byte for byte, with Nats-Msg-Id dlq-<stream_seq>, stored after the advisory; the harness's
re-send of the same advisory (run_main.AdvisoryWatch) stores no second copy."""
import pytest

from retrylab import runreport
from retrylab.checks.jetstream_dlq import dead_letters, deliveries, lab, observe
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.fixtures.jetstream_dlq import events
from retrylab.verdict import fail

pytestmark = pytest.mark.step(5)


def _why_no_advisory(run, seq: int) -> str:
    others = dead_letters.for_other_consumers(run.advisories, "MAX_DELIVERIES", seq)
    if others:
        return tr("step5.advisory_other_consumer", consumers=", ".join(others), consumer=lab.CONSUMER)
    max_deliver = ((run.consumer or {}).get("config") or {}).get("max_deliver")
    if max_deliver is not None and max_deliver <= 0:
        return tr("step5.max_deliver_unset")
    delivered = sum(1 for d in deliveries.deliveries(run.worker.received) if d.stream_seq == seq)
    if delivered >= lab.MAX_DELIVER:
        return tr("step5.stopped_pulling", count=delivered)
    return tr("step5.delivered_too_few", count=delivered, max_deliver=lab.MAX_DELIVER)


def _why_nothing_stored(run) -> str:
    published = dead_letters.published_on(lab.DLQ_SUBJECT, run.worker, run.dlq_service)
    if published:
        return tr("step5.published_not_stored", count=published, subject=lab.DLQ_SUBJECT, stream=lab.DLQ_STREAM,
                  streams=", ".join(run.streams) or "-")
    if run.dlq_service is None and not dead_letters.listened((run.setup,), (run.worker,)):
        return tr("step5.no_listener", advisory=lab.MAX_DELIVERIES_ADVISORY)
    if not dead_letters.listens_for(lab.MAX_DELIVERIES_ADVISORY, (run.setup,), (run.worker, run.dlq_service)):
        return _wrong_subject(run)
    service = run.dlq_service or run.worker
    return tr("step5.nothing_published", subject=lab.DLQ_SUBJECT, how=runreport.how_it_ran(service))


def _wrong_subject(run) -> str:
    return tr("step5.wrong_subject", advisory=lab.MAX_DELIVERIES_ADVISORY,
              subjects=", ".join(dead_letters.listened((run.setup,), (run.worker, run.dlq_service))) or "-")


def test_the_exhausted_poison_is_copied_to_dlq_events_once(main_run, request):
    run = main_run
    runreport.attach_runs(request.node, run.worker, run.dlq_service)
    observe.require_script(run.worker, "worker.py")
    poison, corrupt = run.event("poison"), run.event("corrupt")
    seq, payload = run.seqs[poison["id"]], events.payload(poison)
    advisory = dead_letters.about(run.advisories, lab.MAX_DELIVERIES_ADVISORY, seq)
    if advisory is None:
        fail(tr("step5.no_advisory", advisory=lab.MAX_DELIVERIES_ADVISORY, seq=seq,
                why=_why_no_advisory(run, seq), how=runreport.how_it_ran(run.worker)))

    stored = dead_letters.under(run.dlq, lab.DLQ_SUBJECT)
    if not stored:
        fail(tr("step5.nothing_stored", subject=lab.DLQ_SUBJECT, stream=lab.DLQ_STREAM, why=_why_nothing_stored(run)))
    copies = [m for m in stored if m["data"] == payload]
    others = [m for m in stored if m["data"] != payload]
    if not copies:
        first = others[0]["data"]
        if dead_letters.looks_like_advisory(first):
            fail(tr("step5.advisory_json", subject=lab.DLQ_SUBJECT, seq=seq, data=dead_letters.shown(first)))
        if first == events.payload(corrupt):
            fail(tr("step5.only_corrupt", subject=lab.DLQ_SUBJECT, why=_wrong_subject(run)))
        fail(tr("step5.other_payload", subject=lab.DLQ_SUBJECT, expected=payload.decode(),
                data=dead_letters.shown(first)))

    ids = [dead_letters.msg_id(m) for m in copies]
    expected_id = f"dlq-{seq}"
    if ids[0] != expected_id:
        fail(tr("step5.msg_id", header=lab.MSG_ID_HEADER, expected=expected_id, count=len(copies),
                ids=", ".join(dict.fromkeys(i or tr("step5.no_id") for i in ids))))
    if len(copies) > 1:
        after_resend = run.resent_at is not None and any(
            (dead_letters.timestamp(m["time"]) or 0) >= run.resent_at for m in copies[1:])
        fail(tr("step5.duplicates", count=len(copies), subject=lab.DLQ_SUBJECT,
                ids=", ".join(i or tr("step5.no_id") for i in ids),
                when=tr("step5.after_resend" if after_resend else "step5.before_resend")))
    if others:
        corrupt_too = any(m["data"] == events.payload(corrupt) for m in others)
        fail(tr("step5.corrupt_too" if corrupt_too else "step5.extra", subject=lab.DLQ_SUBJECT,
                count=len(stored), terminated=lab.TERMINATED_SUBJECT,
                data=dead_letters.shown(others[0]["data"])))

    stored_at = dead_letters.timestamp(copies[0]["time"])
    advised_at = dead_letters.published_at(advisory)
    if stored_at is not None and stored_at < advised_at:
        fail(tr("step5.before_advisory", seconds=advised_at - stored_at, advisory=lab.MAX_DELIVERIES_ADVISORY))
