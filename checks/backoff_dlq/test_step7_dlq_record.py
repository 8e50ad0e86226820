"""Step 7: the DLQ entry is JSON with payload, error, attempts (5) and first_seen_at."""
import pytest

from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.messages import decode_json, parse_timestamp, same_original, shorten
from retrylab.fixtures.messages import DLQ
from retrylab.verdict import fail

pytestmark = pytest.mark.step(7)
REQUIRED = ("payload", "error", "attempts", "first_seen_at")
# first_seen_at may be an int of epoch seconds (rounded down) or taken just before process runs
EARLY, LATE = 2.0, 1.5


def test_dlq_entry_records_payload_error_attempts_first_seen(worker_run, request):
    run = worker_run.run
    observe.attach(request.node, run)
    observe.require_script(run, "worker.py")
    bad = worker_run.bad
    raw = next((e for e in observe.dlq_entries(worker_run.dlq) if bad["id"].encode() in e), None)
    if raw is None:
        fail(f"there is no entry for the failing message in {DLQ} to inspect (see step 6). {observe.how_it_ran(run)}")
    calls = worker_run.calls_for(bad)
    if not calls:
        fail("the DLQ holds an entry for the failing message, but process was never called for it: "
             "the entry must record a real failure of process(msg).")
    entry, problem = decode_json(raw)
    if problem:
        fail(f"the DLQ entry is {problem}: {shorten(raw.decode('utf-8', 'replace'))}")
    if not isinstance(entry, dict):
        fail(f"the DLQ entry must be a JSON object with {', '.join(REQUIRED)}; found {shorten(raw.decode('utf-8', 'replace'))}")
    missing = [key for key in REQUIRED if key not in entry]
    if missing:
        fail(f"the DLQ entry lacks {', '.join(missing)}; it has {', '.join(sorted(map(str, entry))) or 'no keys'}.")

    attempts = entry["attempts"]
    if type(attempts) is not int:
        fail(f"attempts is {shorten(repr(attempts))} ({type(attempts).__name__}); store the integer 5.")
    if attempts != 5:
        fail(f"attempts is {attempts}; the message failed 5 times, so the entry should say 5.")

    difference = same_original(entry, bad)
    if difference:
        fail(f"payload must be the original message: {difference}")

    error = entry["error"]
    expected_text = next((c.error for c in reversed(worker_run.calls_for(bad)) if c.error), "")
    if not isinstance(error, str) or not error.strip():
        fail(f"error is {shorten(repr(error))}; record the exception's text (str(exc)) so the cause can be investigated.")
    if expected_text and expected_text not in error:
        fail(f"error is {shorten(repr(error))}, which does not contain the exception's text "
             f"{shorten(repr(expected_text))}; record str(exc).")

    first_seen, problem = parse_timestamp(entry["first_seen_at"])
    if problem:
        fail(f"first_seen_at {shorten(repr(entry['first_seen_at']))}: {problem}")
    first_call, last_call = calls[0].t, calls[-1].t
    if first_seen > first_call + LATE:
        fail(f"first_seen_at is {first_seen - first_call:.1f} s after the message's first attempt "
             f"(the last attempt was {last_call - first_call:.1f} s after it): it must keep the time of the "
             f"first attempt, carried in the message across retries, not be reset on each retry.")
    if first_seen < worker_run.seeded_at - EARLY:
        fail(f"first_seen_at is {worker_run.seeded_at - first_seen:.1f} s before the message was even queued; "
             f"record when the worker first took it (time.time()).")
