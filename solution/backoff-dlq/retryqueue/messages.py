"""A queued message and the bookkeeping the worker adds to it.

A producer sends `{"id": ..., "kind": ..., "data": ...}` (JSON). The worker adds two keys and keeps
them in the message itself, so that whichever worker takes it next carries on counting:

    attempts        how many times process() has failed for it so far (0 when fresh)
    first_seen_at   epoch seconds of the first attempt, never reset by a retry
"""
import json

BOOKKEEPING = ("attempts", "first_seen_at")


class Malformed(ValueError):
    """The queue held something that is not a JSON object: no retry can fix it."""


def decode(raw):
    try:
        msg = json.loads(raw)
    except ValueError as exc:
        raise Malformed(f"not JSON: {exc}") from None
    if not isinstance(msg, dict):
        raise Malformed(f"expected a JSON object, got {type(msg).__name__}")
    return msg


def encode(msg):
    return json.dumps(msg, separators=(",", ":"))


def attempts(msg):
    value = msg.get("attempts", 0)
    # A producer may send no count or a bad one; treat that as a fresh message.
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def first_seen_at(msg, now):
    value = msg.get("first_seen_at")
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else now


def original(msg):
    """The message as the producer sent it: what process() gets and the DLQ keeps."""
    return {k: v for k, v in msg.items() if k not in BOOKKEEPING}


def after_failure(msg, now):
    """The message to retry: one more attempt counted, the first-seen time kept."""
    return {**msg, "attempts": attempts(msg) + 1, "first_seen_at": first_seen_at(msg, now)}


def fresh(payload):
    """A message that starts its retries over (replay): attempts 0, first seen on its next try."""
    return {**original(payload), "attempts": 0}
