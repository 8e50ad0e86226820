"""What crossed the relay, in JetStream's terms: each delivery of a message to the learner (the server's
MSG/HMSG with a `$JS.ACK...` reply subject: stream sequence, delivery count, when) and each answer the
learner gave it (a PUB on that reply subject: ack, nak, nak with a delay, term, in progress).

A learner cannot dress up a message of its own as a delivery: nats-server 2.15 refuses a publish whose reply
subject is under `$JS.ACK` ("permissions violation for publish with reply of ...", measured here)."""
from __future__ import annotations

import json
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.errors import Error as NatsClientError

from retrylab.checks.jetstream_dlq import lab

ACK, NAK, TERM, PROGRESS, NEXT = "ack", "nak", "term", "progress", "next"


@dataclass(frozen=True)
class Delivery:
    at: float               # real time the relay passed it on
    stream_seq: int
    delivered: int          # the delivery count the server put in the reply subject (1, 2, 3...)
    consumer: str
    reply: str
    conn: int


@dataclass(frozen=True)
class Answer:
    at: float
    reply: str              # the delivery's reply subject it answers
    kind: str               # ACK, NAK, TERM, PROGRESS, NEXT, or "unknown"
    delay: float | None     # seconds, for a NAK with a delay


def metadata(reply: str):
    """nats-py's own reading of a JetStream reply subject, or None for anything else."""
    try:
        return Msg.Metadata._from_reply(reply)
    except (NatsClientError, ValueError, IndexError):
        return None


def deliveries(frames, stream: str = lab.STREAM) -> list[Delivery]:
    found = []
    for frame in frames:
        if frame.op not in ("MSG", "HMSG") or not frame.reply.startswith("$JS.ACK."):
            continue
        meta = metadata(frame.reply)
        if meta is None or meta.stream != stream:
            continue
        found.append(Delivery(at=frame.at, stream_seq=meta.sequence.stream, delivered=meta.num_delivered,
                              consumer=meta.consumer, reply=frame.reply, conn=frame.conn))
    return found


def answers(frames) -> list[Answer]:
    """The learner's acknowledgements: PUBs on `$JS.ACK...` subjects, by their payload (nats-py sends an
    empty payload for ack, `-NAK`, `-NAK {"delay": ns}`, `+TERM`, `+WPI`, `+NXT ...`)."""
    found = []
    for frame in frames:
        if frame.op not in ("PUB", "HPUB") or not frame.subject.startswith("$JS.ACK."):
            continue
        body = frame.data.strip()
        kind, delay = "unknown", None
        if body in (b"", b"+ACK"):
            kind = ACK
        elif body.startswith(b"-NAK"):
            kind, delay = NAK, _nak_delay(body[4:])
        elif body.startswith(b"+TERM"):
            kind = TERM
        elif body.startswith(b"+WPI"):
            kind = PROGRESS
        elif body.startswith(b"+NXT"):
            kind = NEXT
        found.append(Answer(at=frame.at, reply=frame.subject, kind=kind, delay=delay))
    return found


def _nak_delay(rest: bytes) -> float | None:
    try:
        value = json.loads(rest) if rest.strip() else None
    except ValueError:
        return None
    delay = value.get("delay") if isinstance(value, dict) else None
    return delay / 1e9 if isinstance(delay, (int, float)) and delay > 0 else None


def of_seq(found: list[Delivery], stream_seq: int, consumer: str | None = lab.CONSUMER) -> list[Delivery]:
    """The deliveries of one stream message, in order (from `consumer` only; None: from any)."""
    return [d for d in found if d.stream_seq == stream_seq and (consumer is None or d.consumer == consumer)]


def answers_to(given: list[Answer], to: list[Delivery]) -> list[Answer]:
    """The answers the learner gave to these deliveries (by their reply subjects), in order."""
    replies = {d.reply for d in to}
    return [a for a in given if a.reply in replies]


def gaps(to: list[Delivery]) -> list[float]:
    """Real seconds between one delivery and the next, as the relay passed them on."""
    return [later.at - earlier.at for earlier, later in zip(to, to[1:])]
