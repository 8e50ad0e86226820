"""Advanced: transient failures are retried, permanent ones go to the DLQ after their first attempt.

The seed's rule: retry timeouts, HTTP 503 and HTTP 429; do not retry a schema violation or a
reference to something that does not exist. The run holds one message of each kind (README.md).
"""
import pytest

from retrylab import runreport
from retrylab.checks.backoff_dlq import advanced, observe
from retrylab.checks.backoff_dlq.stored_values import decode_json, message_id, shorten
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.checks.backoff_dlq.lab import DLQ, MAX_ATTEMPTS
from retrylab.verdict import fail

pytestmark = pytest.mark.advanced("error-classes")


def _entry_for(advanced_run, message):
    """The decoded DLQ entry for `message` (None if there is none), and what the first entry holding
    its id looks like when none decodes to it ("" when one does, or when there is none)."""
    for raw in advanced_run.dlq_entries_for(message):
        value, problem = decode_json(raw)
        if not problem and message_id(value) == message["id"]:
            return value, ""
    raws = advanced_run.dlq_entries_for(message)
    if raws:
        return None, shorten(raws[0].decode("utf-8", "replace"))
    return None, ""


def _transient_problem(advanced_run, kind: str) -> str:
    message = advanced_run.of_kind(kind)
    calls = len(advanced_run.calls_for(message))
    in_dlq = bool(advanced_run.dlq_entries_for(message))
    if calls == MAX_ATTEMPTS and in_dlq:
        return ""
    key = "advanced_msg.error-classes.transient_in_dlq" if in_dlq else "advanced_msg.error-classes.transient_not_in_dlq"
    return tr(key, kind=kind, what=advanced.describe_kind(kind), calls=calls, max=MAX_ATTEMPTS, dlq=DLQ)


def _permanent_problem(advanced_run, kind: str) -> str:
    message = advanced_run.of_kind(kind)
    calls = advanced_run.calls_for(message)
    entry, raw = _entry_for(advanced_run, message)
    facts = dict(kind=kind, what=advanced.describe_kind(kind), dlq=DLQ)
    if len(calls) != 1:
        return tr("advanced_msg.error-classes.permanent_calls", calls=len(calls), **facts)
    if raw:
        return tr("advanced_msg.error-classes.permanent_bad_entry", raw=raw, **facts)
    if entry is None:
        return tr("advanced_msg.error-classes.permanent_missing", **facts)
    text = calls[0].error or ""
    error = entry.get("error") if isinstance(entry, dict) else None
    if not isinstance(error, str) or text not in error:
        return tr("advanced_msg.error-classes.permanent_error", error=shorten(repr(error), 80),
                  text=shorten(repr(text), 80), **facts)
    return ""


def _flaky_problem(advanced_run) -> str:
    flaky = advanced_run.of_kind(advanced.FLAKY)
    calls = advanced_run.calls_for(flaky)
    succeeded = any(c.outcome == "ok" for c in calls)
    dead = bool(advanced_run.dlq_entries_for(flaky))
    if len(calls) == advanced.FLAKY_CALLS and succeeded and not dead:
        return ""
    outcome = {(True, False): "advanced_msg.error-classes.succeeded",
               (False, False): "advanced_msg.error-classes.never_succeeded",
               (True, True): "advanced_msg.error-classes.succeeded_in_dlq",
               (False, True): "advanced_msg.error-classes.never_succeeded_in_dlq"}[succeeded, dead]
    return tr("advanced_msg.error-classes.flaky", what=advanced.describe_kind(advanced.FLAKY), calls=len(calls),
              outcome=tr(outcome, dlq=DLQ))


def _problems(advanced_run) -> list[str]:
    problems = [_transient_problem(advanced_run, kind) for kind in advanced.TRANSIENT]
    problems += [_permanent_problem(advanced_run, kind) for kind in advanced.PERMANENT]
    problems.append(_flaky_problem(advanced_run))
    return [p for p in problems if p]


def test_transient_errors_are_retried_and_permanent_ones_dead_lettered_at_once(advanced_run, request):
    run = advanced_run.run
    runreport.attach_runs(request.node, run)
    observe.require_script(run, "worker.py")
    if not run.calls:
        fail(tr("step1.never_called", how=runreport.how_it_ran(run)))
    problems = _problems(advanced_run)
    if problems:
        fail("\n".join([tr("advanced_msg.error-classes.intro"), *(f"- {p}" for p in problems)]))
