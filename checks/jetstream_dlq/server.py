"""The harness's reads and writes of a private nats-server, in the lab's terms, through the broker's admin
client (retrylab.brokers.nats.admin): every answer the learner's setup can make odd (a missing stream, a
consumer of another kind) becomes None or a plain value, never an exception in a check."""
from __future__ import annotations

import json
from dataclasses import dataclass

from retrylab.brokers.nats.admin import JetStreamError, NatsError
from retrylab.checks.jetstream_dlq import lab

CHANGES_SHOWN = 5       # changed stream settings named in a refusal; a stream re-created at will changes many


def create_events_stream(admin) -> dict:
    """The lab's stream, as the harness creates it before the learner's setup.py runs: its StreamInfo then
    (kept to tell, should EVENTS refuse the lab's events later, whether the learner's setup changed it)."""
    return admin.js(f"STREAM.CREATE.{lab.STREAM}", {"name": lab.STREAM, "subjects": lab.STREAM_SUBJECTS,
                                                    "storage": "memory", "num_replicas": 1})


@dataclass(frozen=True)
class Refusal:
    """Why EVENTS did not take an event the harness published after the learner's setup.py ran, when that
    setup is the cause. kind: "gone" (no stream EVENTS), "resubjected" (EVENTS takes other subjects), "other"
    (stream `other` takes events.created), "sealed" (EVENTS sealed: it takes nothing new, for ever), "changed"
    (EVENTS refused it, or never answered, after setup.py changed `changes`: no_ack, limits...)."""
    kind: str
    subjects: tuple[str, ...] = ()          # "resubjected": EVENTS' subjects now
    other: str = ""                         # "other": the stream that takes events.created
    changes: tuple[str, ...] = ()           # "changed": "setting: before -> now", the first CHANGES_SHOWN
    error: str = ""                         # "changed": the server's answer to the publish


def refused_by(admin, created: dict, error: NatsError) -> Refusal | None:
    """Why publishing on events.created failed with `error`, read from the server itself: the learner's doing
    when no stream takes the subject any more, another stream does, or EVENTS' settings are not those the
    harness `created` it with; None otherwise (EVENTS as the harness made it, or a server that does not answer
    the harness either: a harness or broker failure, not a verdict on the learner)."""
    try:
        takers = [n for n in admin.paged("STREAM.NAMES", "streams", {"subject": lab.SUBJECT}) if isinstance(n, str)]
        try:
            now = admin.js(f"STREAM.INFO.{lab.STREAM}")
        except JetStreamError as exc:
            if exc.code != 404:
                return None
            now = None
    except NatsError:
        return None
    if not takers:
        if now is None:
            return Refusal("gone")
        subjects = (now.get("config") or {}).get("subjects") or []
        return Refusal("resubjected", subjects=tuple(str(s) for s in subjects))
    if takers != [lab.STREAM]:
        return Refusal("other", other=takers[0])
    if now is None:         # EVENTS listed, then not found: a server in two minds is none of the learner's doing
        return None
    before, after = (created or {}).get("config") or {}, now.get("config") or {}
    changes = config_changes(before, after)
    if not changes:
        return None
    if after.get("sealed") and not before.get("sealed"):
        return Refusal("sealed")
    # a refusal from the server follows from the changed settings (limits, discard policy); no answer at all only
    # from a stream that acks nothing: else it is a busy machine's or a broker's failure, not the learner's doing
    if isinstance(error, JetStreamError) or (after.get("no_ack") and not before.get("no_ack")):
        return Refusal("changed", changes=tuple(changes[:CHANGES_SHOWN]), error=str(error))
    return None


def taken_elsewhere(ack: dict) -> Refusal | None:
    """A PubAck from a stream other than EVENTS: the learner's setup made another stream take events.created
    (with EVENTS deleted or re-subjected: two streams never share a subject)."""
    stream = ack.get("stream")
    return None if stream == lab.STREAM else Refusal("other", other=str(stream))


def config_changes(before: dict, after: dict) -> list[str]:
    """The stream settings that differ ("name: before -> after", JSON values); the server's own metadata
    (its version, API level) is no setting of the learner's."""
    keys = sorted((set(before) | set(after)) - {"metadata"})
    return [f"{key}: {_shown(before.get(key))} -> {_shown(after.get(key))}"
            for key in keys if before.get(key) != after.get(key)]


def _shown(value) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False) if value is not None else "-"
    return text if len(text) <= 60 else text[:60] + "..."


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
