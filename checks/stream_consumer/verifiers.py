"""stream-consumer's `retrylab verify` step verifiers: is step N done in a live lab environment?

Read-only facts from the learner's files and own Redis, read with the checks' own stream readers
(streams.py: bounded, binary-safe) and the lab's names and numbers (lab.py). `verify` never runs the
learner's code, so what the checks learn by watching a run (an entry applied once, the waits before a
redelivery, the crash between effect and XACK, a lag series during a burst, the producer's policy)
each step names as unchecked and leaves to `retrylab check`.

What a step leaves behind in the learner's Redis, and so what is decided here:
- 1 group-consume: group `workers` exists on stream `orders`; nothing pending, nothing undelivered.
- 3 dlq: `orders:dlq` is a stream of dead letters, each with error, deliveries = 3 and source_id (an
  entry id of `orders`), and no source_id still pending in the group; where the source entry is still
  in `orders`, the dead letter carries its fields.
- 5 lag: nothing the learner's Redis holds shows a lag series (it exists only while lag.py runs, and
  only a burst the harness starts makes it worth comparing). So step 5 checks that lag.py compiles and
  that the group it measures exists, and states the lag lag.py should print right now (undelivered +
  pending) beside XINFO GROUPS' own `lag` field, which leaves out the pending entries.
- 2, 4, 6 (not asked by the lab for verify, answered so that every step has a verifier): the script
  compiles, the group is drained (2, 4), refusals in `orders:refused` carry order_id and reason (6).
"""
from __future__ import annotations

import re
from typing import Callable

import redis

from retrylab.brokers.redis import catalog as broker_catalog
from retrylab.brokers.redis.live import LiveRedis
from retrylab.checks.stream_consumer import lab, streams
from retrylab.checks.stream_consumer.catalog import tr
from retrylab.verify import CannotCheck, Live, StepVerifier

SCRIPT_LIMIT = 1 << 20      # bytes: a learner's script is a few kilobytes; a larger "script" is not one
ENTRIES_READ = 100          # dead letters and refusals read; the lab leaves one or a few
FIELDS_SHOWN = 12           # field names a message lists: a learner's entry may have thousands
ENTRY_ID = re.compile(r"^\d+-\d+$")


class LiveStreams(LiveRedis):
    """The learner's own Redis, read-only: besides LiveRedis's list reads, it runs streams.py's
    readers, which send TYPE, XINFO GROUPS, XRANGE and XPENDING, nothing that writes."""

    def read(self, reader: Callable[[redis.Redis], object]):
        """`reader(client)`'s answer; the Redis not answering (or refusing) means "cannot check"."""
        self.used = True
        try:
            return reader(self._connect())
        except redis.RedisError as exc:
            reason = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise CannotCheck(broker_catalog.text("verify.unreadable", None, url=self.shown, reason=reason)) from None


def live_broker(url: str) -> LiveStreams:
    """The learner's own Redis at `url`, read-only; connected on first use."""
    return LiveStreams(url)


# --------------------------------------------------------------------------------------------
# the learner's files


def script(live: Live, name: str) -> bool:
    """Whether the script exists, is a regular file of sensible size and compiles (no bytecode written)."""
    path = live.directory / name
    if path.is_symlink():
        live.facts.fail(tr("verify.symlink", name=name))
        return False
    if not path.exists():
        live.facts.fail(tr("verify.missing", name=name, directory=str(live.directory)))
        return False
    if not path.is_file():
        live.facts.fail(tr("verify.not_regular", name=name))
        return False
    with path.open("rb") as f:
        data = f.read(SCRIPT_LIMIT + 1)
    if len(data) > SCRIPT_LIMIT:
        live.facts.fail(tr("verify.too_large", name=name, megabytes=SCRIPT_LIMIT >> 20))
        return False
    live.facts.ok(tr("verify.exists", name=name))
    try:
        compile(data, name, "exec", dont_inherit=True)
    except SyntaxError as exc:   # Python's own words for the error (exc.msg) stay as Python says them
        if exc.lineno:
            live.facts.fail(tr("verify.does_not_compile_line", name=name, error=exc.msg, line=exc.lineno))
        else:
            live.facts.fail(tr("verify.does_not_compile", name=name, error=exc.msg))
        return False
    except Exception as exc:  # noqa: BLE001 - NUL bytes, nesting too deep: still the learner's file
        live.facts.fail(tr("verify.does_not_compile", name=name, error=streams.text(str(exc) or type(exc).__name__, 120)))
        return False
    live.facts.ok(tr("verify.compiles", name=name))
    return True


# --------------------------------------------------------------------------------------------
# the learner's Redis


def a_stream(live: Live, key: str) -> str:
    """The key's type ("stream", "none", or another), with a failed fact when it is neither."""
    kind = live.broker.read(lambda client: streams.key_type(client, key))
    if kind not in ("stream", "none"):
        live.facts.fail(tr("verify.not_a_stream", key=key, type=kind))
    return kind


def the_group(live: Live) -> streams.GroupState | None:
    """Group `workers` on `orders`, with a failed fact saying what to do when there is none."""
    kind = a_stream(live, lab.STREAM)
    if kind == "none":
        live.facts.fail(tr("verify.no_stream", stream=lab.STREAM, group=lab.GROUP))
        return None
    if kind != "stream":
        return None
    state = live.broker.read(streams.group)
    if state is None:
        live.facts.fail(tr("verify.no_group", stream=lab.STREAM, group=lab.GROUP))
        return None
    live.facts.ok(tr("verify.group_exists", stream=lab.STREAM, group=lab.GROUP, consumers=state.consumers))
    return state


def drained(live: Live, state: streams.GroupState) -> None:
    if state.pending:
        live.facts.fail(tr("verify.still_pending", group=lab.GROUP, count=state.pending))
    else:
        live.facts.ok(tr("verify.nothing_pending", group=lab.GROUP))
    if state.undelivered:
        key = "verify.undelivered_many" if state.undelivered >= streams.MAX_ENTRIES else "verify.undelivered"
        live.facts.fail(tr(key, group=lab.GROUP, stream=lab.STREAM, count=state.undelivered))
    else:
        live.facts.ok(tr("verify.nothing_undelivered", group=lab.GROUP, stream=lab.STREAM))


def group_consume(live: Live) -> None:
    if not script(live, "consumer.py"):
        return
    state = the_group(live)
    if state is not None:
        drained(live, state)


# --------------------------------------------------------------------------------------------
# step 3: the dead letters


def dead_letter_problem(entry: streams.Entry, pending_ids: set[bytes], source: streams.Entry | None) -> str:
    """What is wrong with one dead letter ("" when nothing is)."""
    shown = streams.text(entry.id)
    missing = [name for name in lab.DLQ_FIELDS if name not in {k.decode("utf-8", "replace") for k in entry.fields}]
    if missing:
        names = sorted(streams.text(k, 40) for k in entry.fields)
        more = ", ..." if len(names) > FIELDS_SHOWN else ""
        fields = ", ".join(names[:FIELDS_SHOWN]) + more or tr("verify.no_fields")
        return tr("verify.dlq_lacks", id=shown, missing=", ".join(missing), fields=fields)
    error = entry.get("error") or ""
    if not error.strip():
        return tr("verify.dlq_empty_error", id=shown)
    deliveries = (entry.get("deliveries") or "").strip()
    if not deliveries.isascii() or not deliveries.isdigit() or int(deliveries) != lab.MAX_DELIVERIES:
        return tr("verify.dlq_deliveries", id=shown, value=streams.text(entry.get("deliveries"), 40),
                  expected=lab.MAX_DELIVERIES)
    source_id = (entry.get("source_id") or "").strip()
    if not ENTRY_ID.match(source_id):
        return tr("verify.dlq_source_id", id=shown, value=streams.text(entry.get("source_id"), 60), stream=lab.STREAM)
    if source_id.encode() in pending_ids:
        return tr("verify.dlq_source_pending", id=shown, source=source_id, group=lab.GROUP, stream=lab.STREAM)
    if source is not None:
        for name, value in source.fields.items():
            if entry.fields.get(name) != value:
                return tr("verify.dlq_field_changed", id=shown, source=source_id, field=streams.text(name, 40),
                          value=streams.text(value, 60))
    return ""


def dlq(live: Live) -> None:
    kind = a_stream(live, lab.DLQ)
    if kind == "none":
        live.facts.fail(tr("verify.no_dlq", dlq=lab.DLQ))
    if kind != "stream":
        return
    letters = live.broker.read(lambda client: streams.entries(client, lab.DLQ, count=ENTRIES_READ))
    if not letters:
        live.facts.fail(tr("verify.dlq_empty", dlq=lab.DLQ))
        return
    live.facts.ok(tr("verify.dlq_holds", dlq=lab.DLQ, count=len(letters)))
    orders_kind = a_stream(live, lab.STREAM)
    pending_ids = ({p.id for p in live.broker.read(streams.pending)} if orders_kind == "stream" else set())

    def source_of(letter: streams.Entry) -> streams.Entry | None:
        source_id = (letter.get("source_id") or "").strip()
        if orders_kind != "stream" or not ENTRY_ID.match(source_id):
            return None
        found = live.broker.read(lambda client: streams.entries(client, lab.STREAM, start=source_id, count=1))
        return found[0] if found and found[0].id == source_id.encode() else None

    for letter in letters:
        problem = dead_letter_problem(letter, pending_ids, source_of(letter))
        if problem:
            live.facts.fail(problem)
            return
    live.facts.ok(tr("verify.dlq_fields_ok", count=len(letters), deliveries=lab.MAX_DELIVERIES))
    live.facts.ok(tr("verify.dlq_sources_acked", count=len(letters), group=lab.GROUP))


# --------------------------------------------------------------------------------------------
# step 5: the lag


def lag(live: Live) -> None:
    if not script(live, "lag.py"):
        return
    state = the_group(live)
    if state is None:
        return
    xinfo_lag = live.broker.read(_xinfo_lag)
    shown = tr("verify.lag_unknown") if xinfo_lag is None else str(xinfo_lag)
    live.facts.note(tr("verify.lag_now", lag=state.lag, undelivered=state.undelivered, pending=state.pending,
                       xinfo=shown))
    if state.pending:
        live.facts.note(tr("verify.lag_pending_counts", pending=state.pending))


def _xinfo_lag(client: redis.Redis):
    """XINFO GROUPS' own `lag` field for the group (None: absent, or Redis cannot tell)."""
    for info in client.xinfo_groups(lab.STREAM):
        name = info.get("name", info.get(b"name"))
        if (name.decode("utf-8", "replace") if isinstance(name, bytes) else name) == lab.GROUP:
            return info.get("lag", info.get(b"lag"))
    return None


# --------------------------------------------------------------------------------------------
# steps 2, 4 and 6: what their runs leave behind


def consumer_drained(live: Live) -> None:
    group_consume(live)


def refusals(live: Live) -> None:
    if not script(live, "producer.py"):
        return
    kind = a_stream(live, lab.REFUSED)
    if kind == "none":
        live.facts.note(tr("verify.no_refusals", key=lab.REFUSED))
    if kind != "stream":
        return
    records = live.broker.read(lambda client: streams.entries(client, lab.REFUSED, count=ENTRIES_READ))
    for record in records:
        missing = [name for name in ("order_id", "reason") if not (record.get(name) or "").strip()]
        if missing:
            live.facts.fail(tr("verify.refusal_lacks", key=lab.REFUSED, id=streams.text(record.id),
                               missing=", ".join(missing)))
            return
    live.facts.ok(tr("verify.refusals_ok", key=lab.REFUSED, count=len(records)))


def step_verifiers() -> dict[int, StepVerifier]:
    """The verifier of each lab step, its texts in the current language."""
    return {
        1: StepVerifier(group_consume, (tr("verify.unchecked.consume_once"), tr("verify.unchecked.consume_creates"))),
        2: StepVerifier(consumer_drained, (tr("verify.unchecked.retry_reclaimed"), tr("verify.unchecked.retry_waits"))),
        3: StepVerifier(dlq, (tr("verify.unchecked.dlq_three"), tr("verify.unchecked.dlq_others_flow"))),
        4: StepVerifier(consumer_drained, (tr("verify.unchecked.idempotent_crash"),)),
        5: StepVerifier(lag, (tr("verify.unchecked.lag_series"), tr("verify.unchecked.lag_drains"))),
        6: StepVerifier(refusals, (tr("verify.unchecked.policy"), tr("verify.unchecked.accounting"))),
    }
