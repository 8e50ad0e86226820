"""Advanced: transient failures are retried, permanent ones go to the DLQ after their first attempt.

The seed's rule: retry timeouts, HTTP 503 and HTTP 429; do not retry a schema violation or a
reference to something that does not exist. The run holds one message of each kind (README.md).
"""
import pytest

from retrylab.checks.backoff_dlq import advanced, observe
from retrylab.checks.backoff_dlq.messages import decode_json, message_id, shorten
from retrylab.fixtures.messages import DLQ
from retrylab.verdict import fail

pytestmark = pytest.mark.advanced("error-classes")


def _entry_for(advanced_run, message):
    """The decoded DLQ entry for `message` (None if there is none), and a problem with it."""
    for raw in advanced_run.dlq_entries_for(message):
        value, problem = decode_json(raw)
        if not problem and message_id(value) == message["id"]:
            return value, ""
    raws = advanced_run.dlq_entries_for(message)
    if raws:
        raw = shorten(raws[0].decode("utf-8", "replace"))
        return None, f"its DLQ entry is not a JSON object carrying the message: {raw}"
    return None, ""


def _problems(advanced_run) -> list[str]:
    problems = []
    for kind in advanced.TRANSIENT:
        message = advanced_run.of_kind(kind)
        calls = len(advanced_run.calls_for(message))
        in_dlq = bool(advanced_run.dlq_entries_for(message))
        if calls != advanced.MAX_ATTEMPTS or not in_dlq:
            where = "then went to the DLQ" if in_dlq else f"and it is not in {DLQ}"
            problems.append(f"{kind} ({advanced.DESCRIBE[kind]}, transient): process was called {calls} time(s) "
                            f"{where}; expected {advanced.MAX_ATTEMPTS} attempts, then the DLQ.")
    for kind in advanced.PERMANENT:
        message = advanced_run.of_kind(kind)
        calls = advanced_run.calls_for(message)
        entry, problem = _entry_for(advanced_run, message)
        if len(calls) != 1:
            problems.append(f"{kind} ({advanced.DESCRIBE[kind]}, permanent): process was called {len(calls)} "
                            f"time(s); a retry cannot fix it, so it goes to {DLQ} after the first attempt.")
        elif problem or entry is None:
            problems.append(f"{kind} ({advanced.DESCRIBE[kind]}, permanent): {problem or f'it never reached {DLQ}'}.")
        else:
            text = calls[0].error or ""
            error = entry.get("error") if isinstance(entry, dict) else None
            if not isinstance(error, str) or text not in error:
                problems.append(f"{kind} ({advanced.DESCRIBE[kind]}, permanent): its DLQ entry's error is "
                                f"{shorten(repr(error), 80)}; record why it was not retried: the exception's text "
                                f"{shorten(repr(text), 80)}.")
    flaky = advanced_run.of_kind(advanced.FLAKY)
    calls = advanced_run.calls_for(flaky)
    succeeded = any(c.outcome == "ok" for c in calls)
    if len(calls) != advanced.FLAKY_CALLS or not succeeded or advanced_run.dlq_entries_for(flaky):
        outcome = "it succeeded" if succeeded else "it never succeeded"
        dead = f" and it is in {DLQ}" if advanced_run.dlq_entries_for(flaky) else ""
        problems.append(f"flaky ({advanced.DESCRIBE['flaky']}): process was called {len(calls)} time(s), "
                        f"{outcome}{dead}; a timeout is transient: retried, it succeeds on the 3rd attempt.")
    return problems


def test_transient_errors_are_retried_and_permanent_ones_dead_lettered_at_once(advanced_run, request):
    run = advanced_run.run
    observe.attach(request.node, run)
    observe.require_script(run, "worker.py")
    if not run.calls:
        fail(f"process(msg) was never called. {observe.how_it_ran(run)}")
    problems = _problems(advanced_run)
    if problems:
        fail("the worker does not tell failures worth retrying from those that are not:\n"
             + "\n".join(f"- {p}" for p in problems))
