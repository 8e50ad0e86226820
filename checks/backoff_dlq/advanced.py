"""What the advanced checks of backoff-dlq read, and how: seed 000's "what to retry" list, the
virtual clock and the commands the worker sent. The runs they read are made in runs.py.

Reading the virtual clock. Every process() call takes one second of the run's virtual time, and a
call's record carries the run clock's offset (what sleeping and earlier calls added), so the time between two
calls splits exactly into processing (one second per call), sleeping (the offset's growth beyond
that) and real time (everything else: Redis round trips, printing, and blocking Redis calls with a
timeout, which wait in real time). Sleeping counts as waiting in full; real time counts only beyond
an allowance per call, so a slow or noisy worker is not taken for one that waits.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from retrylab.brokers.redis.commands import Command
from retrylab.calllog import Call
from retrylab.checks.backoff_dlq import lab
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.checks.backoff_dlq.stored_values import decode_json, message_id
from retrylab.fixtures.backoff_dlq.taskproc import SECONDS_PER_CALL

TRANSIENT = ("bad", "timeout", "unavailable", "throttled")   # retried until the limit, then the DLQ
PERMANENT = ("invalid", "orphan")                             # the DLQ after the first attempt
FLAKY = "flaky"                                               # fails twice, then succeeds
FLAKY_CALLS = 3
KINDS = (*TRANSIENT, *PERMANENT, FLAKY)


def describe_kind(kind: str) -> str:
    """What taskproc raises for a kind of message, in the current language: "HTTPError with status 503"."""
    return tr(f"advanced_msg.kinds.{kind}")


# Real time between two calls that is not taken for waiting: Redis round trips, JSON, printing
# (a worker printing 3,000 lines a message spends about 0.1 s).
REAL_ALLOWANCE = 0.25
BACKOFF_SLACK = 1.0     # beyond the bound: a worker that polls for due retries (every 0.5 s, say)
ZERO_WAITS = 0.1        # all waits of the failing message together below this: it does not wait
EQUAL_WAITS = 0.05      # every wait within this of the others: the wait does not grow or vary
BLOCKED = 0.25          # waiting this long while good messages were ready: the queue was held up

# Commands that take values out of a list (or the whole key), with where their keys are.
_FIRST_KEY = {"LPOP", "RPOP", "LREM", "LTRIM", "LMOVE", "BLMOVE", "RPOPLPUSH", "BRPOPLPUSH",
              "RENAME", "RENAMENX"}
_ALL_KEYS = {"DEL", "UNLINK"}
_KEYS_THEN_TIMEOUT = {"BLPOP", "BRPOP"}
_SCRIPTS = {"EVAL", "EVAL_RO", "EVALSHA", "EVALSHA_RO"}
_LUA_REMOVAL = re.compile(
    r"""\.\s*p?call\s*\(\s*['"](lpop|rpop|lrem|ltrim|lmove|rpoplpush|lmpop|del|unlink|rename|renamenx)['"]""",
    re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# time on the virtual clock


def ordered(calls: Iterable[Call]) -> list[Call]:
    return sorted(calls, key=lambda c: c.t)


def _offsets_usable(calls: Sequence[Call]) -> bool:
    """Offsets (the run clock's, recorded by the harness) tell sleeping from real time when present."""
    offsets = [c.offset for c in calls]
    return all(o is not None for o in offsets) and all(a <= b + 1e-6 for a, b in zip(offsets, offsets[1:]))


def waited(calls: Sequence[Call], start: int, end: int) -> float:
    """Seconds the worker waited between the starts of calls[start] and calls[end] (time-ordered):
    sleeping in full, real time beyond REAL_ALLOWANCE per call, processing (1 s a call) not at all."""
    if end <= start:
        return 0.0
    a, b = calls[start], calls[end]
    n = end - start
    if _offsets_usable(calls):
        slept = (b.offset - a.offset) - n * SECONDS_PER_CALL
        real = (b.t - b.offset) - (a.t - a.offset)
        return max(0.0, slept) + max(0.0, real - n * REAL_ALLOWANCE)
    return max(0.0, (b.t - a.t) - n * (SECONDS_PER_CALL + REAL_ALLOWANCE))


@dataclass(frozen=True)
class Wait:
    after: int          # the failed attempt it follows (1 = after the first failure)
    seconds: float
    others: int         # process calls for other messages in between

    @property
    def bound(self) -> float:
        """The longest wait capped exponential backoff allows here, under either numbering (the
        first retry waits up to base * 2**0 or base * 2**1): the larger, base * 2**after."""
        return lab.capped(self.after)


def retry_waits(calls: Iterable[Call], message_id: str, limit: int = lab.MAX_ATTEMPTS) -> list[Wait]:
    """The waits between successive attempts of one message (its first `limit` attempts)."""
    timeline = ordered(calls)
    positions = [i for i, c in enumerate(timeline) if c.id == message_id][:limit]
    return [Wait(after=k, seconds=waited(timeline, i, j), others=j - i - 1)
            for k, (i, j) in enumerate(zip(positions, positions[1:]), start=1)]


def backoff_problem(waits: Sequence[Wait]) -> str:
    """Why these waits are not capped exponential backoff with jitter ("" when they are), in the
    current language."""
    if not waits:
        return ""
    for wait in waits:
        if wait.seconds > wait.bound + BACKOFF_SLACK:
            return tr("advanced_msg.backoff-applied.too_long", after=wait.after, seconds=wait.seconds,
                      base=lab.BACKOFF_BASE, cap=lab.BACKOFF_CAP, bound=wait.bound)
    seconds = [w.seconds for w in waits]
    if sum(seconds) <= ZERO_WAITS:
        return tr("advanced_msg.backoff-applied.no_wait")
    if len(seconds) > 1 and max(seconds) - min(seconds) <= EQUAL_WAITS:
        return tr("advanced_msg.backoff-applied.same_wait", seconds=seconds[0])
    return ""


def describe_waits(waits: Sequence[Wait]) -> str:
    return tr("advanced_msg.backoff-applied.seconds", waits=", ".join(f"{w.seconds:.2f}" for w in waits))


def blocked_goods(calls: Iterable[Call], goods: Sequence[dict]) -> list[tuple[dict, float]]:
    """(good message, seconds the worker waited before its first call while it was ready), for
    every good message that was processed; in queue order."""
    timeline = ordered(calls)
    found = []
    for good in goods:
        index = next((i for i, c in enumerate(timeline) if c.id == good["id"]), None)
        if index is not None:
            found.append((good, waited(timeline, 0, index)))
    return found


# --------------------------------------------------------------------------------------------
# commands that take entries out of the DLQ


def _keys_of(command: Command, scripts: dict[str, bytes]) -> tuple[list[bytes], bytes]:
    """The keys a command names, and a script's text for EVAL/EVALSHA (b"" otherwise)."""
    name, args = command.name, command.args
    try:
        if name in _FIRST_KEY:
            return list(args[1:2]), b""
        if name in _ALL_KEYS:
            return list(args[1:]), b""
        if name in _KEYS_THEN_TIMEOUT:
            return list(args[1:-1]), b""
        if name == "LMPOP":
            return list(args[2:2 + int(args[1])]), b""
        if name == "BLMPOP":
            return list(args[3:3 + int(args[2])]), b""
        if name in _SCRIPTS:
            count = int(args[2])
            script = args[1] if name.startswith("EVAL_") or name == "EVAL" else scripts.get(
                args[1].decode("latin-1").lower(), b"")
            return list(args[3:3 + count]), script
    except (ValueError, IndexError):
        pass
    return [], b""


def dlq_removals(commands: Iterable[Command], dlq: bytes = lab.DLQ.encode()) -> list[Command]:
    """The commands that would take entries out of the DLQ: list pops and moves from it, LREM, LTRIM,
    DEL/UNLINK, RENAME (queued in MULTI or not), and scripts that name it and remove from a list."""
    scripts: dict[str, bytes] = {}
    found = []
    for command in commands:
        if command.name == "SCRIPT" and len(command.args) > 2 and command.args[1].upper() == b"LOAD":
            scripts[hashlib.sha1(command.args[2]).hexdigest()] = command.args[2]
            continue
        keys, script = _keys_of(command, scripts)
        if command.name in _SCRIPTS:
            text = script.decode("utf-8", "replace")
            if (dlq in keys or dlq in script) and _LUA_REMOVAL.search(text):
                found.append(command)
        elif dlq in keys:
            found.append(command)
    return found


def show_command(command: Command, limit: int = 80) -> str:
    text = " ".join(a.decode("utf-8", "replace") for a in command.args)
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def dead_lettered_ids(commands: Iterable[Command], dlq: bytes = lab.DLQ.encode()) -> set[str]:
    """The message ids the worker wrote into the DLQ (seen on the wire)."""
    found = set()
    for command in commands:
        if command.name in ("LPUSH", "RPUSH", "LPUSHX", "RPUSHX", "LINSERT", "LSET") and command.args[1:2] == (dlq,):
            for arg in command.args[2:]:
                value, problem = decode_json(arg)
                mid = message_id(value) if not problem else None
                if mid:
                    found.add(mid)
    return found
