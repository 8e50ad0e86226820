"""Step 3: the poison order (always fails) is moved to the stream orders:dlq after exactly 3 deliveries,
with its original fields plus `error` (the effect's error text in it), `deliveries` (3) and `source_id`
(its entry id in orders), XACKed in orders, never delivered again, and dead-lettered once.

Meanwhile the other entries keep flowing. The rule: every ok order is applied exactly once, and each of
the LATE orders the harness added right after the poison's first failure is applied before the poison's
3rd call of effects.apply. A right consumer has at least two min-idle waits (>= 200 ms together) between
the poison's 1st and 3rd calls, and the late orders are in the stream within milliseconds of the first:
only a consumer that retries the poison in line (sleeping or reclaiming it while the rest waits) fails.
"""
import pytest

from retrylab import runreport
from retrylab.checks.stream_consumer import lab, observe, redelivery, streams
from retrylab.checks.stream_consumer.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.step(3)


def _dead_letters(retry, order_id: str, entry_id: str) -> list[streams.Entry]:
    return [e for e in retry.dlq if e.get("order_id") == order_id or e.get("source_id") == entry_id]


def _first_dlq_write(commands, order_id: str):
    """The first XADD to orders:dlq naming the order (None: written another way, e.g. from a Lua script)."""
    return next((c for c in commands if c.name == "XADD" and len(c.args) > 1 and c.args[1] == lab.DLQ.encode()
                 and order_id.encode() in c.args), None)


def _require_dead_letter(retry, calls, entry_id: str) -> streams.Entry:
    """The poison's one dead letter, written after its 3rd failed call; or fail with what became of it."""
    poison, run = retry.poison, retry.run
    order_id = poison["order_id"]
    if retry.dlq_type not in ("none", "stream"):
        fail(tr("step3.dlq_not_stream", dlq=lab.DLQ, type=retry.dlq_type))
    if not calls:
        fail(tr("step3.never_called", id=order_id, how=runreport.how_it_ran(run)))
    letters = _dead_letters(retry, order_id, entry_id)
    if not letters:
        if len(calls) > lab.MAX_DELIVERIES:
            fail(tr("step3.retried_forever", id=order_id, calls=len(calls), dlq=lab.DLQ, max=lab.MAX_DELIVERIES))
        pending = retry.pending_entry(poison)
        if redelivery.skipped(calls, run.commands, retry.entry_id(poison), pending):
            fail(tr("step3.skipped", id=order_id, dlq=lab.DLQ))
        if pending is None:
            fail(tr("step3.dropped", id=order_id, calls=len(calls), dlq=lab.DLQ))
        fail(tr("step3.stuck", id=order_id, calls=len(calls), dlq=lab.DLQ, max=lab.MAX_DELIVERIES,
                how=runreport.how_it_ran(run)))
    if retry.pending_entry(poison) is not None:   # not XACKed: a 4th delivery would be its consequence
        fail(tr("step3.still_pending", id=order_id, dlq=lab.DLQ, group=lab.GROUP, stream=lab.STREAM))
    if len(calls) != lab.MAX_DELIVERIES:
        fail(tr("step3.wrong_count", id=order_id, calls=len(calls), dlq=lab.DLQ, max=lab.MAX_DELIVERIES))
    written = _first_dlq_write(run.commands, order_id)
    if written is not None and written.at < calls[-1].t:
        fail(tr("step3.written_early", id=order_id, dlq=lab.DLQ, max=lab.MAX_DELIVERIES))
    if len(letters) > 1:
        fail(tr("step3.twice_in_dlq", id=order_id, dlq=lab.DLQ, count=len(letters)))
    return letters[0]


def _require_fields(letter: streams.Entry, poison: dict, calls, entry_id: str) -> None:
    order_id = poison["order_id"]
    missing = [k for k in (*poison, *lab.DLQ_FIELDS) if not (letter.value(k) or "").strip()]
    if missing:
        fail(tr("step3.missing_fields", id=order_id, missing=", ".join(missing), stream=lab.STREAM,
                max=lab.MAX_DELIVERIES))
    changed = next((k for k, v in poison.items() if letter.value(k) != v), None)
    if changed:
        fail(tr("step3.field_changed", id=order_id, field=changed, seen=letter.get(changed), added=poison[changed]))
    error = letter.value("error")
    errors = [c.error for c in calls if c.error]
    if not any(e in error for e in errors):
        fail(tr("step3.bad_error", id=order_id, seen=streams.text(error, 120), expected=errors[-1] if errors else ""))
    if letter.value("deliveries").strip() != str(lab.MAX_DELIVERIES):
        fail(tr("step3.bad_deliveries", id=order_id, seen=letter.get("deliveries"), max=lab.MAX_DELIVERIES))
    if letter.value("source_id").strip() != entry_id:
        fail(tr("step3.bad_source", id=order_id, seen=letter.get("source_id"), stream=lab.STREAM, expected=entry_id))


def _require_flow(retry, last_poison_call) -> None:
    """Every ok order applied once; each late one before the poison's last delivery."""
    run = retry.run
    effects = observe.effects(run)
    for order in retry.seeded:
        if order["kind"] == "ok" and effects[order["order_id"]] != 1:
            fail(tr("step3.ok_not_once", id=order["order_id"], count=effects[order["order_id"]],
                    how=runreport.how_it_ran(run)))
    for order in retry.late:
        applied = next(c for c in run.calls if c.id == order["order_id"] and c.outcome == "ok")
        if applied.t > last_poison_call.t:
            fail(tr("step3.late_after_poison", id=order["order_id"], max=lab.MAX_DELIVERIES,
                    ms=round((applied.t - last_poison_call.t) * 1000)))


def test_poison_dead_lettered_after_3_deliveries_while_the_rest_flows(retry_run, request):
    run = retry_run.run
    runreport.attach_runs(request.node, run)
    observe.require_script(run, "consumer.py")
    observe.require_honest_calls(run, retry_run.seeded)
    poison = retry_run.poison
    entry_id = streams.text(retry_run.entry_id(poison))
    calls = observe.calls_for(run, poison["order_id"])
    letter = _require_dead_letter(retry_run, calls, entry_id)
    _require_fields(letter, poison, calls, entry_id)
    _require_flow(retry_run, calls[-1])
