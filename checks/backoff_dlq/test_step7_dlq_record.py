"""Step 7: the DLQ entry is JSON with payload, error, attempts (5) and first_seen_at."""
import pytest

from retrylab import runreport
from retrylab.appchannel import RUN_CLOCK_LEAD
from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.stored_values import decode_json, parse_timestamp, same_original, shorten
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.checks.backoff_dlq.lab import DLQ, DLQ_FIELDS, MAX_ATTEMPTS
from retrylab.verdict import fail

pytestmark = pytest.mark.step(7)
# first_seen_at may be an int of epoch seconds (rounded down) or taken just before process runs
EARLY, LATE = 2.0, 1.5
# The run's clock is days ahead of real time: a first_seen_at this far before the queueing was read from
# a clock in real time (redis.call('TIME') in a Lua script, say), not the run's.
OTHER_CLOCK = RUN_CLOCK_LEAD / 2


def test_dlq_entry_records_payload_error_attempts_first_seen(worker_run, request):
    run = worker_run.run
    runreport.attach_runs(request.node, run)
    observe.require_script(run, "worker.py")
    observe.require_honest_calls(run, worker_run.seeded)
    bad = worker_run.bad
    raw = next((e for e in observe.dlq_entries(worker_run.dlq) if bad["id"].encode() in e), None)
    if raw is None:
        fail(tr("step7.no_entry", dlq=DLQ, how=runreport.how_it_ran(run)))
    calls = worker_run.calls_for(bad)
    if not calls:
        fail(tr("step7.no_real_failure"))
    entry, problem = decode_json(raw)
    if problem:
        fail(tr("step7.not_json", problem=problem, raw=shorten(raw.decode("utf-8", "replace"))))
    if not isinstance(entry, dict):
        fail(tr("step7.not_object", required=", ".join(DLQ_FIELDS), raw=shorten(raw.decode("utf-8", "replace"))))
    missing = [key for key in DLQ_FIELDS if key not in entry]
    if missing:
        keys = ", ".join(sorted(map(str, entry))) or tr("step7.no_keys")
        fail(tr("step7.lacks", missing=", ".join(missing), keys=keys))

    attempts = entry["attempts"]
    if type(attempts) is not int:
        fail(tr("step7.attempts_type", value=shorten(repr(attempts)), type=type(attempts).__name__))
    if attempts != MAX_ATTEMPTS:
        fail(tr("step7.attempts_value", attempts=attempts))

    difference = same_original(entry, bad)
    if difference:
        fail(tr("step7.payload", difference=difference))

    error = entry["error"]
    expected_text = next((c.error for c in reversed(worker_run.calls_for(bad)) if c.error), "")
    if not isinstance(error, str) or not error.strip():
        fail(tr("step7.error_empty", value=shorten(repr(error))))
    if expected_text and expected_text not in error:
        fail(tr("step7.error_text", value=shorten(repr(error)), expected=shorten(repr(expected_text))))

    first_seen, problem = parse_timestamp(entry["first_seen_at"])
    if problem:
        fail(tr("step7.first_seen_unreadable", value=shorten(repr(entry["first_seen_at"])), problem=problem))
    first_call, last_call = calls[0].t, calls[-1].t
    if first_seen > first_call + LATE:
        fail(tr("step7.first_seen_reset", after=first_seen - first_call, last=last_call - first_call))
    before = worker_run.seeded_at - first_seen
    if before > OTHER_CLOCK:
        fail(tr("step7.first_seen_other_clock", days=before / 86400))
    if before > EARLY:
        fail(tr("step7.first_seen_early", before=before))
