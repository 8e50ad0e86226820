"""What step 6 reads of producer.py's own words: its policy line, and the refusals it recorded.

Refusals live in key `orders:refused`, in any of three shapes a learner may reasonably pick:
    stream   one entry per refusal, fields `order_id` and `reason`
    list     one JSON object per item: {"order_id": ..., "reason": ...}
    hash     one field per refusal; its value a JSON object with `reason` (and `order_id`, which defaults
             to the field's name) or plain text: the reason, with the field's name as the order id
Anything else (a set, a string, ...) is a problem the check reports. Values are bounded: a learner may
write binary or huge items.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

import redis

from retrylab.checks.stream_consumer import lab, streams

POLICY_LINE = re.compile(r"^\s*policy=(\S*)")
MAX_ITEMS = streams.MAX_ENTRIES


@dataclass(frozen=True)
class Refusal:
    order_id: str | None    # None or "": the record does not say which order it refused
    reason: str | None
    shown: str              # the record as a learner would recognise it (bounded)


def policy_lines(stdout: str) -> list[str]:
    """The value of each stdout line that starts with `policy=` (whatever follows it on the line)."""
    return [m.group(1) for line in stdout.splitlines() if (m := POLICY_LINE.match(line))]


def _json_object(raw: bytes) -> dict | None:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _field(value) -> str | None:
    """A JSON value or stored bytes as text (numbers are fine for an id), None when missing."""
    if value is None:
        return None
    if isinstance(value, (bytes, str)):
        return streams.text(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def json_order_id(raw: bytes) -> str | None:
    """The order_id of a JSON object (as refusals show it), None if `raw` is not one that has it."""
    found = _json_object(raw)
    return _field(found.get("order_id")) if found is not None else None


def _from_json(raw: bytes, default_id: str | None = None) -> Refusal:
    shown = streams.text(raw)
    found = _json_object(raw)
    if found is None:
        return Refusal(None, None, shown)
    order_id = _field(found.get("order_id")) if "order_id" in found else default_id
    return Refusal(order_id, _field(found.get("reason")), shown)


def read(client: redis.Redis, key: str = lab.REFUSED) -> tuple[list[Refusal], str | None]:
    """The refusals recorded in `key`, and the key's type when it is none of the shapes accepted."""
    kind = streams.key_type(client, key)
    if kind == "none":
        return [], None
    if kind == "stream":
        return [Refusal(e.get("order_id"), e.get("reason"), shown_entry(e)) for e in streams.entries(client, key)], None
    if kind == "list":
        return [_from_json(raw[:streams.MAX_FIELD_BYTES]) for raw in client.lrange(key, 0, MAX_ITEMS - 1)], None
    if kind == "hash":
        found = []
        for field, raw in list(client.hscan_iter(key, count=200))[:MAX_ITEMS]:
            order_id, raw = streams.text(field), raw[:streams.MAX_FIELD_BYTES]
            as_json = _json_object(raw)
            if as_json is None:   # plain text: field = order id, value = reason
                found.append(Refusal(order_id, streams.text(raw), f"{order_id} = {streams.text(raw)}"))
            else:
                found.append(_from_json(raw, default_id=order_id))
        return found, None
    return [], kind


def shown_entry(entry: streams.Entry) -> str:
    return " ".join(f"{streams.text(k, 40)}={streams.text(v, 80)}" for k, v in list(entry.fields.items())[:6])
