"""Dead letters: what a message that will not be retried any more records, and how it comes back.

A DLQ is read by a human, weeks later, who has to answer: what was it, why did it fail, how
often was it tried, since when, and where. The first four keys are the lab's; the rest make the
investigation shorter.
"""
import json
import traceback

from . import errors, messages
from .keys import DLQ

TRACEBACK_LIMIT = 2000  # characters; the end of a traceback (where it was raised) matters most


def record(payload, exc, *, attempts, first_seen_at, failed_at, worker_id):
    """The DLQ entry (a dict, stored as JSON) for `payload`, given up on after `exc`."""
    return {
        "payload": payload,                    # the message as the producer sent it
        "error": errors.describe(exc),         # exception type and text
        "attempts": attempts,                  # how many times process() failed
        "first_seen_at": first_seen_at,        # epoch s of the first attempt
        "last_failed_at": failed_at,           # epoch s of the last attempt
        "error_class": errors.classify(exc),   # "permanent": sent here at once; "retryable": ran out of attempts
        "exception": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "traceback": _traceback_tail(exc),
        "worker": worker_id,
    }


def _traceback_tail(exc):
    text = "".join(traceback.format_exception(exc))
    return text if len(text) <= TRACEBACK_LIMIT else "..." + text[-TRACEBACK_LIMIT:]


def push(pipe, entry):
    """Queue, on `pipe`, the entry onto the DLQ (at the tail: the oldest stays at the head)."""
    pipe.rpush(DLQ, json.dumps(entry))


def parse(raw):
    """The entry as a dict, or None if it is not a JSON object (left for a human)."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def to_message(raw):
    """(message to put back on the queue, None) or (None, why this entry cannot be replayed)."""
    entry = parse(raw)
    if entry is None:
        return None, "not a JSON object"
    payload = entry.get("payload")
    if not isinstance(payload, dict):
        return None, "its payload is not a message object"
    # A fresh series of retries: attempts 0, and the next first attempt sets its own first_seen_at.
    return messages.fresh(payload), None


def message_id(raw):
    entry = parse(raw) or {}
    payload = entry.get("payload")
    return payload.get("id") if isinstance(payload, dict) else None

