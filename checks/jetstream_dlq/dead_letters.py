"""Dead letters in the lab's terms, for step 5 and the advanced checks: the advisories the server published
about an event, the copies stored under a DLQ subject, their Nats-Msg-Id and times, and what the learner's
scripts listened to and published (from the relay's record), to say why nothing was stored."""
from __future__ import annotations

import json
from datetime import datetime

from retrylab.checks.jetstream_dlq import lab, server

ADVISORY_TYPE = "io.nats.jetstream.advisory.v1."


def covers(pattern: str, subject: str) -> bool:
    """Whether a subscription or stream subject (with * and > wildcards) takes messages on `subject`."""
    parts, tokens = pattern.split("."), subject.split(".")
    for i, part in enumerate(parts):
        if part == ">":
            return len(tokens) > i
        if i >= len(tokens) or (part != "*" and part != tokens[i]):
            return False
    return len(parts) == len(tokens)


def body(advisory) -> dict:
    """An advisory's JSON (an Advisory of run_main, or anything with .data), {} when it is not JSON."""
    try:
        value = json.loads(advisory.data)
    except (ValueError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


def about(advisories, subject: str, seq: int) -> object | None:
    """The first advisory the server itself published on `subject` about stream sequence `seq`."""
    return next((a for a in advisories if not getattr(a, "by_harness", False) and a.subject == subject
                 and body(a).get("stream_seq") == seq), None)


def for_other_consumers(advisories, kind: str, seq: int) -> list[str]:
    """Consumers other than worker-consumer the server published a `kind` advisory for about `seq`."""
    prefix = f"$JS.EVENT.ADVISORY.CONSUMER.{kind}.{lab.STREAM}."
    return sorted({a.subject[len(prefix):] for a in advisories if a.subject.startswith(prefix)
                   and a.subject[len(prefix):] != lab.CONSUMER and body(a).get("stream_seq") == seq})


def timestamp(text: str) -> float | None:
    """Epoch seconds of a server time (RFC 3339 with nanoseconds), None if unreadable."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


def published_at(advisory) -> float:
    """When the server published an advisory: its own timestamp (the server's clock, as stored messages'
    times are), or when the harness received it."""
    stamp = timestamp(body(advisory).get("timestamp", ""))
    return stamp if stamp is not None else advisory.at


def under(messages, subject: str) -> list[dict]:
    return [m for m in messages if m.get("subject") == subject]


def msg_id(message: dict) -> str | None:
    return server.header(message.get("headers") or b"", lab.MSG_ID_HEADER)


def looks_like_advisory(data: bytes) -> bool:
    try:
        value = json.loads(data)
    except (ValueError, TypeError):
        return False
    return isinstance(value, dict) and (str(value.get("type", "")).startswith(ADVISORY_TYPE)
                                        or ("stream_seq" in value and "consumer" in value))


def shown(data: bytes, limit: int = 120) -> str:
    text = data.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "..."


def _commands(runs):
    for run in runs:
        if run is not None and not run.missing:
            yield from run.commands


_STREAM_WRITES = ("$JS.API.STREAM.CREATE.", "$JS.API.STREAM.UPDATE.")
_CONSUMER_READS = ("$JS.API.CONSUMER.CREATE.", "$JS.API.CONSUMER.DURABLE.CREATE.", "$JS.API.CONSUMER.INFO.",
                   "$JS.API.CONSUMER.MSG.NEXT.")


def stream_subjects(*runs) -> dict[str, list[str]]:
    """The subjects of each stream the scripts created or updated, as they asked for them."""
    found: dict[str, list[str]] = {}
    for frame in _commands(runs):
        if frame.op in ("PUB", "HPUB") and frame.subject.startswith(_STREAM_WRITES):
            try:
                subjects = json.loads(frame.data).get("subjects") or []
            except (ValueError, AttributeError):
                continue
            found[frame.subject.split(".")[4]] = [s for s in subjects if isinstance(s, str)]
    return found


def streams_read(*runs) -> set[str]:
    """The streams the scripts made or used a consumer on (to read them)."""
    found = set()
    for frame in _commands(runs):
        if frame.op in ("PUB", "HPUB"):
            prefix = next((p for p in _CONSUMER_READS if frame.subject.startswith(p)), None)
            if prefix:
                found.add(frame.subject[len(prefix):].split(".")[0])
    return found


def listened(made_by, listeners) -> list[str]:
    """What the listeners listened to: their subscriptions (nats-py's inboxes left out), and the subjects of
    the streams they read whose subjects a script of `made_by` (or a listener) set: a stream that captures
    advisories listens for its reader."""
    found: list[str] = [f.subject for f in _commands(listeners) if f.op == "SUB" and not f.subject.startswith("_INBOX.")]
    subjects = stream_subjects(*made_by, *listeners)
    for stream in sorted(streams_read(*listeners)):
        found += subjects.get(stream, [])
    return list(dict.fromkeys(found))


def listens_for(subject: str, made_by, listeners) -> bool:
    return any(covers(s, subject) for s in listened(made_by, listeners))


def published_on(subject: str, *runs) -> int:
    """How many messages the scripts published on `subject` (plain or JetStream publishes)."""
    return sum(1 for f in _commands(runs) if f.op in ("PUB", "HPUB") and f.subject == subject)
