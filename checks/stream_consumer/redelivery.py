"""How an entry came back after a failure, read from the call log (Call.t, real time in these runs) and
the relay's command record (Command.at, the same clock): steps 2 and 3's evidence.

A redelivery is a call of effects.apply for an order that follows a failed call for it. Its wait is the
gap between the two calls; the min-idle it was claimed with is the last claim of the entry the relay saw
between them: XCLAIM orders workers <consumer> <min-idle-ms> ... naming the entry's id, or XAUTOCLAIM
orders workers <consumer> <min-idle-ms> <start> ... (which names no id: any on `orders` counts).
"""
from __future__ import annotations

from dataclasses import dataclass

from retrylab.checks.stream_consumer import lab

CLAIMS = ("XCLAIM", "XAUTOCLAIM")


@dataclass(frozen=True)
class Redelivery:
    failed_at: float                # Call.t of the failed call before it
    at: float                       # Call.t of this call
    min_idle_ms: int | None         # of the claim that brought it back (None: no claim seen)

    @property
    def gap(self) -> float:
        return self.at - self.failed_at


def _key(command) -> bytes | None:
    return command.args[1] if len(command.args) > 1 else None


def is_claim(command, entry_id: bytes) -> bool:
    """An XCLAIM of `entry_id`, or any XAUTOCLAIM, on the lab's stream."""
    if command.name not in CLAIMS or _key(command) != lab.STREAM.encode():
        return False
    return command.name == "XAUTOCLAIM" or entry_id in command.args[5:]


def min_idle_ms(command) -> int | None:
    try:
        return int(command.args[4])
    except (IndexError, ValueError):
        return None


def acks(commands, entry_id: bytes) -> list:
    """The XACKs of `entry_id` on the lab's stream, in order."""
    return [c for c in commands if c.name == "XACK" and _key(c) == lab.STREAM.encode() and entry_id in c.args[3:]]


def claims_between(commands, entry_id: bytes, start: float, end: float) -> list:
    return [c for c in commands if start <= c.at <= end and is_claim(c, entry_id)]


def skipped(calls, commands, entry_id: bytes, pending) -> bool:
    """Whether the entry was delivered again after its last call of apply, and apply was not called:
    its pending entry counts more deliveries than calls, or an XCLAIM of it came after the last call
    (and before the XACK that ended it). `pending`: its streams.Pending at the end, None if not pending."""
    if pending is not None and pending.deliveries > len(calls):
        return True
    last = calls[-1].t
    acked = [a.at for a in acks(commands, entry_id) if a.at >= last]
    claims = claims_between(commands, entry_id, last, acked[0] if acked else float("inf"))
    return any(c.name == "XCLAIM" for c in claims)


def redeliveries(calls, commands, entry_id: bytes) -> list[Redelivery]:
    """Each call that follows a failed call of the same order (`calls`: that order's, by time)."""
    found = []
    for before, call in zip(calls, calls[1:]):
        if before.outcome != "error":
            continue
        claims = claims_between(commands, entry_id, before.t, call.t)
        found.append(Redelivery(before.t, call.t, min_idle_ms(claims[-1]) if claims else None))
    return found


def claimed_with(redelivered: Redelivery) -> int | None:
    """The min-idle that brought the entry back, if the observed wait agrees with it: a claim with min-idle
    m takes an entry idle for m since its last delivery, which came just before the failed call; MIN_RETRY_GAP
    is allowed for the work between that delivery and the call. A wait much shorter than the min-idle says
    the claim did not take it (an XAUTOCLAIM sent for show, the entry re-read from the consumer's own list)."""
    m = redelivered.min_idle_ms
    if m is None or redelivered.gap < m / 1000 - lab.MIN_RETRY_GAP:
        return None
    return m


def waits_grow(first: Redelivery, second: Redelivery) -> bool:
    """Whether the second wait is longer than the first: by the min-idle the entry was claimed with (both
    at least MIN_RETRY_GAP, each agreeing with its wait), or by the observed gaps, the second longer by
    MIN_RETRY_GAP at least (a constant min-idle seen through a poll period of up to 100 ms must not pass by
    chance)."""
    idle1, idle2 = claimed_with(first), claimed_with(second)
    if idle1 is not None and idle2 is not None and lab.MIN_RETRY_GAP * 1000 <= idle1 < idle2:
        return True
    return second.gap >= first.gap + lab.MIN_RETRY_GAP
