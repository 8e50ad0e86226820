"""backoff-dlq's numbers and rules (seed 000), in one place.

The step checks, the advanced checks, the `retrylab verify` step verifiers and the message factories
all read them here, so a lab text that changes "5 attempts" or "cap 30 s" changes one line.
"""
from __future__ import annotations

from retrylab.checks.backoff_dlq.stored_values import attempts_of, original_fields

QUEUE = "q:tasks"              # the work queue the worker consumes
DLQ = "q:tasks:dlq"            # where a message goes once it has failed MAX_ATTEMPTS times

MAX_ATTEMPTS = 5               # failures (calls of process) before the DLQ; the DLQ entry's `attempts`
BACKOFF_BASE = 1.0             # seconds: wait = base * 2**attempt
BACKOFF_CAP = 30.0             # seconds: capped at min(cap, base * 2**attempt)
REPLAYED_ATTEMPTS = 0          # the count a replayed message starts again from

# What a DLQ entry records, so that an investigation has what it needs (step 7)
DLQ_FIELDS = ("payload", "error", "attempts", "first_seen_at")


def exponential(attempt: int) -> float:
    """The lab's exponential backoff: base * 2**attempt seconds."""
    return BACKOFF_BASE * 2 ** attempt


def capped(attempt: int) -> float:
    """The lab's capped backoff: min(cap, base * 2**attempt) seconds."""
    return min(BACKOFF_CAP, exponential(attempt))


def counted_fields(value) -> dict:
    """Where a message's attempt count is read: the top level (a plain message or an envelope); an
    envelope without one may still carry the old count inside its payload, which a worker then reads."""
    if isinstance(value, dict) and "attempts" in value:
        return value
    return original_fields(value) or {}


def count_not_reset(value) -> bool:
    """A replayed message that still carries a count other than REPLAYED_ATTEMPTS where a worker reads
    it (no count at all is a fresh message)."""
    fields = counted_fields(value)
    return "attempts" in fields and attempts_of(fields) != REPLAYED_ATTEMPTS
