"""Reading the lab's streams from the harness's own client, bounded (a learner may flood a stream or
write binary fields), with every answer the learner's data can make odd turned into plain values.

Entries and fields are bytes (the harness's client does not decode): a check shows them with `text()`.
"""
from __future__ import annotations

from dataclasses import dataclass

import redis

from retrylab.checks.stream_consumer import lab

MAX_ENTRIES = 2000          # of one stream read at once; the lab's runs add a few hundred at most
MAX_FIELD_BYTES = 4096      # a field value longer than this is kept cut: its start and its end


@dataclass(frozen=True)
class Entry:
    id: bytes
    fields: dict[bytes, bytes]

    def get(self, name: str) -> str | None:
        """The field's text to show: value() cut to 200 characters."""
        value = self.value(name)
        return None if value is None else text(value)

    def value(self, name: str) -> str | None:
        """The field's text to compare: as stored, a long one its start and its end (a dead letter's error may
        be a whole traceback, whose exception text comes last)."""
        value = self.fields.get(name.encode())
        return None if value is None else value.decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class GroupState:
    """XINFO GROUPS for one group, and what the harness computes from the stream itself."""
    pending: int
    last_delivered: bytes
    undelivered: int        # entries after last-delivered-id (counted, not XINFO's `lag`, which can be None)
    consumers: int

    @property
    def lag(self) -> int:
        return self.undelivered + self.pending


@dataclass(frozen=True)
class Pending:
    id: bytes
    consumer: bytes
    idle_ms: int
    deliveries: int


def text(value: bytes | str | None, limit: int = 200) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    return value if len(value) <= limit else value[:limit] + "…"


def key_type(client: redis.Redis, key: str) -> str:
    kind = client.type(key)
    return kind.decode() if isinstance(kind, bytes) else kind


def length(client: redis.Redis, key: str = lab.STREAM) -> int | None:
    """XLEN, or None when the key is not a stream (a learner's script may have made it something else)."""
    try:
        return client.xlen(key)
    except redis.ResponseError:
        return None


def _xrange(client: redis.Redis, key: str, start: bytes | str, count: int) -> list | None:
    """XRANGE from `start`: [] for a missing key, None when the key is not a stream. No TYPE before it: a
    learner's script still running may change the key's type between two commands, so the one that reads
    is the one that says."""
    try:
        return client.xrange(key, start, "+", count=count)
    except redis.ResponseError:     # WRONGTYPE
        return None


def entries(client: redis.Redis, key: str, *, start: bytes | str = "-", count: int = MAX_ENTRIES) -> list[Entry]:
    """The stream's first `count` entries from `start` ([] when the key is missing or not a stream)."""
    found = []
    for entry_id, fields in _xrange(client, key, start, count) or []:
        fields = fields or {}
        # every field: a legitimate dead letter may add many of its own before the lab's (the reply is in memory
        # already; only each value is cut)
        found.append(Entry(entry_id, {k: _cut(v) for k, v in fields.items()}))
    return found


def _cut(value: bytes) -> bytes:
    """A field's value, bounded: a long one keeps its start and its end (a traceback's exception text comes
    last), with a gap no comparison can match across."""
    if len(value) <= MAX_FIELD_BYTES:
        return value
    half = MAX_FIELD_BYTES // 2
    return value[:half] + b"\n[...]\n" + value[-half:]


SNAPSHOT_TRIES = 4          # reads of a group's state before one that moved while it was read is taken as is


def _group_info(client: redis.Redis, key: str, name: str) -> dict | None:
    try:
        infos = client.xinfo_groups(key)
    except redis.ResponseError:     # no such key, or not a stream (WRONGTYPE)
        return None
    for info in infos:
        info = {(k.decode() if isinstance(k, bytes) else k): v for k, v in info.items()}
        group_name = info.get("name")
        if (group_name.decode() if isinstance(group_name, bytes) else group_name) == name:
            last = info.get("last-delivered-id") or b"0-0"
            return {"last": last.encode() if isinstance(last, str) else last,
                    "pending": int(info.get("pending") or 0), "consumers": int(info.get("consumers") or 0)}
    return None


def group(client: redis.Redis, key: str = lab.STREAM, name: str = lab.GROUP) -> GroupState | None:
    """The group's state, or None when the stream or the group does not exist.

    XINFO GROUPS and the XRANGE that counts what is past last-delivered-id are two commands: entries the
    consumer reads and acknowledges between them would count twice (in the range, and in the pending count
    read before), so a busy machine that delays the second command saw a lag the group never had. The state
    is taken when XINFO GROUPS reads the same (last-delivered-id, pending) after the range as before it: no
    entry was delivered or acknowledged meanwhile. A group that keeps moving is counted from the later read,
    which can only miss entries added meanwhile: a lag no higher than the group's."""
    after = _group_info(client, key, name)
    for _ in range(SNAPSHOT_TRIES):
        before = after
        if before is None:
            return None
        past = _xrange(client, key, b"(" + before["last"], MAX_ENTRIES)
        if past is None:
            return None
        after = _group_info(client, key, name)
        if after is None:
            return None
        if (after["last"], after["pending"]) == (before["last"], before["pending"]):
            break
    undelivered = sum(1 for i, _ in past if _id_after(i, after["last"]))
    return GroupState(pending=after["pending"], last_delivered=after["last"], undelivered=undelivered,
                      consumers=after["consumers"])


def id_order(value: bytes, bound: tuple[int, int] = (0, 0)) -> tuple[int, int] | None:
    """A stream id, or a range bound as commands take them, as (ms, seq) for comparing: "-" and "+" are `bound`
    (the caller's end), a missing seq is bound's, a leading "(" (exclusive) is ignored; None when it is no id."""
    if value in (b"-", b"+"):
        return bound
    ms, _, seq = value.lstrip(b"(").partition(b"-")
    try:
        return int(ms), int(seq) if seq else bound[1]
    except ValueError:
        return None


def _id_after(entry_id: bytes, last: bytes) -> bool:
    entry, delivered = id_order(entry_id), id_order(last)
    # an id Redis would not give: count it, as the range did
    return entry is None or delivered is None or entry > delivered


def pending(client: redis.Redis, key: str = lab.STREAM, name: str = lab.GROUP) -> list[Pending]:
    """The group's pending entries ([] when there is no such group)."""
    try:
        rows = client.xpending_range(key, name, "-", "+", MAX_ENTRIES)
    except redis.ResponseError:
        return []
    return [Pending(r["message_id"], r["consumer"], int(r["time_since_delivered"]), int(r["times_delivered"]))
            for r in rows]


def seed(client: redis.Redis, orders: list[dict], key: str = lab.STREAM) -> list[bytes]:
    """XADD each order (its fields), in order; the ids Redis gave them."""
    with client.pipeline(transaction=False) as pipe:
        for fields in orders:
            pipe.xadd(key, fields)
        # a learner's script may have made `key` something else (WRONGTYPE): those entries are not added
        return [r for r in pipe.execute(raise_on_error=False) if not isinstance(r, Exception)]


def create_group(client: redis.Redis, key: str = lab.STREAM, name: str = lab.GROUP, start: str = "0") -> None:
    """The group as the harness creates it before steps 2-6 (LAB.md): at id 0, the stream made if missing."""
    client.xgroup_create(key, name, id=start, mkstream=True)
