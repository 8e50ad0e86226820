"""What a private nats-server holds, for the runner and the checks: `shape` (cheap, comparable, from the
monitoring endpoint's /jsz: one HTTP request) and `dump` (streams with their configuration, state,
consumers and stored messages, bounded, through the JetStream API)."""
from __future__ import annotations

from dataclasses import dataclass, field

from retrylab.brokers.nats.admin import AdminClient, Monitor

MESSAGES_PER_STREAM = 1000      # a snapshot reads at most this many messages of each stream,
MESSAGES = 10_000               # this many in all (one JetStream request each),
MESSAGE_BYTES = 16 << 20        # and this many payload bytes in all


def shape(monitor: Monitor) -> tuple:
    """Per stream: its name, messages, last sequence and consumers; per consumer: what it delivered and
    what is pending or unacknowledged. It changes when a learner's work changes the server, and not when a
    worker merely polls (pull requests waiting are left out)."""
    summary = []
    for stream in monitor.streams():
        state = stream.get("state") or {}
        consumers = tuple(sorted(
            (c.get("name", ""), (c.get("delivered") or {}).get("stream_seq", 0),
             (c.get("ack_floor") or {}).get("stream_seq", 0), c.get("num_pending", 0), c.get("num_ack_pending", 0),
             c.get("num_redelivered", 0))
            for c in stream.get("consumer_detail") or ()))
        summary.append((stream.get("name", ""), state.get("messages", 0), state.get("last_seq", 0), consumers))
    return tuple(sorted(summary))


@dataclass(frozen=True)
class StoredMessage:
    seq: int
    subject: str
    headers: bytes          # the header block as stored ("NATS/1.0\r\n..."), b"" if none
    data: bytes
    time: str


@dataclass
class StreamContent:
    config: dict
    state: dict
    consumers: dict[str, dict]              # name -> ConsumerInfo (config, delivered, ack_floor, num_pending, ...)
    messages: list[StoredMessage] = field(default_factory=list)
    truncated: bool = False                 # more messages were stored than the snapshot read


def dump(admin: AdminClient) -> dict[str, StreamContent]:
    """Every stream by name (see the module's text)."""
    streams: dict[str, StreamContent] = {}
    budget, left = MESSAGE_BYTES, MESSAGES
    for info in admin.paged("STREAM.LIST", "streams"):
        config, state = info.get("config") or {}, info.get("state") or {}
        name = config.get("name", "")
        consumers = {c.get("name", ""): c for c in admin.paged(f"CONSUMER.LIST.{name}", "consumers")}
        content = StreamContent(config, state, consumers)
        seq, last = state.get("first_seq", 1) or 1, state.get("last_seq", 0)
        while seq <= last:
            if len(content.messages) >= MESSAGES_PER_STREAM or budget <= 0 or left <= 0:
                content.truncated = True
                break
            message = admin.get_msg(name, seq, next_by_subj=">")
            if message is None:
                break
            content.messages.append(StoredMessage(message["seq"], message["subject"], message["headers"],
                                                  message["data"], message["time"]))
            budget -= len(message["data"]) + len(message["headers"])
            left -= 1
            seq = message["seq"] + 1
        streams[name] = content
    return streams
