"""The harness's reads and writes of a private nats-server, in the lab's terms, through the broker's admin
client (retrylab.brokers.nats.admin): every answer the learner's setup can make odd (a missing stream, a
consumer of another kind) becomes None or a plain value, never an exception in a check."""
from __future__ import annotations

from retrylab.brokers.nats.admin import JetStreamError, NatsError
from retrylab.checks.jetstream_dlq import lab


def create_events_stream(admin) -> None:
    """The lab's stream, as the harness creates it before the learner's setup.py runs."""
    admin.js(f"STREAM.CREATE.{lab.STREAM}", {"name": lab.STREAM, "subjects": lab.STREAM_SUBJECTS,
                                             "storage": "memory", "num_replicas": 1})


def consumer_info(admin, stream: str = lab.STREAM, consumer: str = lab.CONSUMER) -> dict | None:
    try:
        return admin.js(f"CONSUMER.INFO.{stream}.{consumer}")
    except JetStreamError:
        return None


def stream_info(admin, stream: str) -> dict | None:
    try:
        return admin.js(f"STREAM.INFO.{stream}")
    except JetStreamError:
        return None


def stream_names(admin) -> list[str]:
    try:
        return [n for n in admin.paged("STREAM.NAMES", "streams") if isinstance(n, str)]
    except NatsError:
        return []


def consumer_names(admin, stream: str) -> list[str]:
    try:
        return [n for n in admin.paged(f"CONSUMER.NAMES.{stream}", "consumers") if isinstance(n, str)]
    except NatsError:
        return []


def messages(admin, stream: str, *, limit: int = 200) -> list[dict]:
    """The stream's stored messages, first `limit` ({"subject", "seq", "headers", "data", "time"})."""
    info = stream_info(admin, stream)
    if info is None:
        return []
    state = info.get("state") or {}
    found, seq, last = [], state.get("first_seq", 1) or 1, state.get("last_seq", 0) or 0
    while seq <= last and len(found) < limit:
        try:
            message = admin.get_msg(stream, seq, next_by_subj=">")
        except NatsError:
            break
        if message is None:
            break
        found.append(message)
        seq = message["seq"] + 1
    return found


def header(headers: bytes, name: str) -> str | None:
    """A header's value in a stored header block ("NATS/1.0\\r\\nName: value\\r\\n..."), None if absent."""
    for line in headers.decode("utf-8", "replace").split("\r\n")[1:]:
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == name.lower():
            return value.strip()
    return None
