"""What the advanced checks of backoff-dlq observe, and how they read it.

Advanced checks go beyond the lab's text (seed 000's "what to retry" list and its two classic
mistakes); they are reported apart and never change the lab's result. They read `advanced_run`
(session-scoped, made once per grading like `worker_run`): ONE extra run of the learner's worker on
its own private Redis, and the two runs of alert.py (DLQ empty, DLQ with 3 entries). Where each
private Redis is a server of its own (`independent_privates`: fake, redis-server), all of it goes on
while the lab steps' worker run does (`start_early`), and the alert runs beside this worker run: a
grading waits about as long as for one worker run instead of four learner runs one after another.

For the worker run:

- the queue holds one message of each kind taskproc knows (README.md in this folder: "Advanced
  checks") and four good ones: a good message at each end and two in the middle, so that whichever
  end the worker pops, good messages wait behind every failing one;
- the DLQ already holds one entry, left there by an earlier failure, before the worker starts: a
  worker must leave it alone until a person runs replay.py.

backoff-applied reads `worker_run` instead (steps 1, 2, 6, 7: six good messages and one bad one):
there the failing message is the only one that waits, so its waits can be told apart from any other
message's. In the mixed run above, a worker that does not block spends other messages' processing
time during a retry's wait, which hides the wait from the clock.

Reading the virtual clock. Every process() call takes one second of the run's virtual time, and a
call's record carries the run clock's offset (what sleeping and earlier calls added), so the time between two
calls splits exactly into processing (one second per call), sleeping (the offset's growth beyond
that) and real time (everything else: Redis round trips, printing, and blocking Redis calls with a
timeout, which wait in real time). Sleeping counts as waiting in full; real time counts only beyond
an allowance per call, so a slow or noisy worker is not taken for one that waits.
"""
from __future__ import annotations

import contextvars
import copy
import hashlib
import json
import re
import threading
from dataclasses import dataclass
from typing import Iterable, Sequence

import pytest

from retrylab.brokers.redis import keyspace
from retrylab.appchannel import RunClock
from retrylab.calllog import Call
from retrylab.checks.backoff_dlq.messages import decode_json, message_id, tr
from retrylab.checks.backoff_dlq.settling import ONE_SHOT, RUN_TIMEOUT, every_message_accounted, worker_settled
from retrylab.fixtures import messages
from retrylab.fixtures.taskproc import SECONDS_PER_CALL
from retrylab.fixtures.taskproc_app import TaskprocApp
from retrylab.brokers.redis.proxy import Command
from retrylab.runner import ScriptRun
from retrylab.settle import Reason, when

MAX_ATTEMPTS = 5
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
BACKOFF_BASE, BACKOFF_CAP = 1.0, 30.0
BACKOFF_SLACK = 1.0     # beyond the bound: a worker that polls for due retries (every 0.5 s, say)
ZERO_WAITS = 0.1        # all waits of the failing message together below this: it does not wait
EQUAL_WAITS = 0.05      # every wait within this of the others: the wait does not grow or vary
BLOCKED = 0.25          # waiting this long while good messages were ready: the queue was held up
ALERT_DEPTH = 3         # entries in the DLQ for the second run of alert.py
ALERT_TIMEOUT = 10.0    # outer bound, real seconds, of each run of alert.py (settling.ONE_SHOT stops loops)

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
# the shared run


def advanced_batch() -> list[dict]:
    """One message of each kind plus four good ones, goods at both ends and in the middle."""
    kind = messages.new_message
    return [kind("good"), kind("bad"), kind("timeout"), kind("invalid"), kind(FLAKY), kind("good"),
            kind("good"), kind("unavailable"), kind("orphan"), kind("throttled"), kind("good")]


@dataclass(frozen=True)
class AlertRun:
    entries: int                 # entries in the DLQ when alert.py started
    run: ScriptRun
    left: int | None             # entries in the DLQ after it (None: the DLQ is no longer a list)


@dataclass(frozen=True)
class AdvancedRun:
    seeded: tuple[dict, ...]
    preseeded: dict              # the message of the DLQ entry that was there before the worker started
    preseeded_entry: bytes
    run: ScriptRun
    keys: dict                   # the whole keyspace after the run
    seeded_at: float             # on the run's clock (RunClock.now), as the calls' times are
    alerts: tuple[AlertRun, ...] = ()   # alert.py with the DLQ empty, then with ALERT_DEPTH entries

    def of_kind(self, kind: str) -> dict:
        return next(m for m in self.seeded if m["kind"] == kind)

    @property
    def goods(self) -> tuple[dict, ...]:
        return tuple(m for m in self.seeded if m["kind"] == "good")

    @property
    def dlq(self) -> keyspace.KeyContent | None:
        return self.keys.get(messages.DLQ.encode())

    @property
    def queue(self) -> keyspace.KeyContent | None:
        return self.keys.get(messages.QUEUE.encode())

    def calls(self) -> list[Call]:
        return ordered(self.run.calls)

    def calls_for(self, message: dict) -> list[Call]:
        return [c for c in self.calls() if c.id == message["id"]]

    def dlq_entries_for(self, message: dict) -> list[bytes]:
        return [v for v in (self.dlq.values if self.dlq else ()) if message["id"].encode() in v]


def run_alerts(learner, redis_backend, cancelled: threading.Event) -> tuple[AlertRun, ...]:
    """`python alert.py` against one private Redis: with the DLQ empty, then with ALERT_DEPTH entries."""
    runs = []
    with redis_backend.private() as endpoint, endpoint.client() as client:
        for entries in (0, ALERT_DEPTH):
            client.delete(messages.DLQ)
            if entries:
                client.rpush(messages.DLQ, *(messages.lab_dlq_entry(messages.new_message("bad"),
                                                                    error="kind=bad is rejected by taskproc")
                                             for _ in range(entries)))
            run = learner.run("alert.py", endpoint, timeout=ALERT_TIMEOUT,
                              stop_when=when(lambda progress: cancelled.is_set(), Reason.CANCELLED) | ONE_SHOT)
            left = client.llen(messages.DLQ) if client.type(messages.DLQ) == b"list" else None
            runs.append(AlertRun(entries=entries, run=run, left=left))
            if run.missing or cancelled.is_set():
                break
    return tuple(runs)


class Alongside:
    """`work(cancelled)` run in a thread of its own, beside what the checks do meanwhile.

    `result()` waits for it and returns its value (or raises its exception) in the caller's thread;
    `stop()` asks the work to end (its learner runs treat `cancelled` as "settled") and waits for it,
    so nothing of it outlives the grading's private Redis. Learner runs in here are bounded by their
    own timeouts, not by a step's time limit (that clock belongs to the main thread): the step that
    asks for the result is, as it waits."""

    def __init__(self, work, name: str, cancelled: threading.Event | None = None):
        self.cancelled = cancelled or threading.Event()
        self._outcome: dict = {}

        def target():
            try:
                self._outcome["value"] = work(self.cancelled)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the thread that asks for the result
                self._outcome["error"] = exc

        # in a copy of the caller's context: what the work says (a limit a learner run hit, say) is
        # in the grading's language (retrylab.i18n keeps it in a context variable)
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(target,), name=name, daemon=True)
        self._thread.start()

    def result(self):
        self._thread.join()
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]

    def stop(self) -> None:
        self.cancelled.set()
        self._thread.join()


def _unclocked(learner):
    alone = copy.copy(learner)
    alone.clock = None
    return alone


def _observe(learner, redis_backend, cancelled: threading.Event) -> AdvancedRun:
    alerts = None
    if redis_backend.independent_privates:  # else one server (or database) is emptied for each private Redis
        alerts = Alongside(lambda c: run_alerts(_unclocked(learner), redis_backend, c), "retrylab-alert-runs",
                           cancelled)
    try:
        batch = advanced_batch()
        preseeded = messages.new_message("bad")
        clock = RunClock.for_learner_run()   # days ahead of real time: the harness's times are on it too
        entry = messages.lab_dlq_entry(preseeded, first_seen_at=clock.now() - 3600,
                                       error=f"task {preseeded['id']}: kind=bad is rejected by taskproc").encode()
        with redis_backend.private() as endpoint, endpoint.client() as client:
            client.rpush(messages.DLQ, entry)
            client.rpush(messages.QUEUE, *(json.dumps(m) for m in batch))
            seeded_at = clock.now()
            run = learner.run("worker.py", endpoint, timeout=RUN_TIMEOUT,
                              stop_when=worker_settled(every_message_accounted(batch), cancelled),
                              app=TaskprocApp(seeded=[*batch, preseeded]), run_clock=clock)
            content = keyspace.dump(client)
        alert_runs = alerts.result() if alerts else run_alerts(learner, redis_backend, cancelled)
    except BaseException:
        if alerts:
            alerts.stop()   # nothing of this run may outlive it (a step's time limit, Ctrl-C)
        raise
    return AdvancedRun(seeded=tuple(batch), preseeded=preseeded, preseeded_entry=entry, run=run,
                       keys=content, seeded_at=seeded_at, alerts=alert_runs)


_EARLY = pytest.StashKey[Alongside]()


def start_early(request, learner, redis_backend) -> None:
    """Begin the advanced run now, beside the lab steps' worker run, when the grading includes advanced
    checks and the two runs can use private Redis at once: a grading then waits for one worker run
    instead of two. Called from the session fixture of that worker run; stopped when the session ends."""
    config = request.config
    if (_EARLY in config.stash or not redis_backend.independent_privates
            or not any(item.get_closest_marker("advanced") for item in request.session.items)):
        return
    early = Alongside(lambda cancelled: _observe(_unclocked(learner), redis_backend, cancelled),
                      "retrylab-advanced-run")
    config.stash[_EARLY] = early
    request.addfinalizer(early.stop)


@pytest.fixture(scope="session")
def advanced_run(learner, redis_backend, pytestconfig) -> AdvancedRun:
    early = pytestconfig.stash.get(_EARLY, None)
    if early is not None:
        return early.result()
    return _observe(learner, redis_backend, threading.Event())


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
        return min(BACKOFF_CAP, BACKOFF_BASE * 2 ** self.after)


def retry_waits(calls: Iterable[Call], message_id: str, limit: int = MAX_ATTEMPTS) -> list[Wait]:
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
                      base=BACKOFF_BASE, cap=BACKOFF_CAP, bound=wait.bound)
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


def dlq_removals(commands: Iterable[Command], dlq: bytes = messages.DLQ.encode()) -> list[Command]:
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


def dead_lettered_ids(commands: Iterable[Command], dlq: bytes = messages.DLQ.encode()) -> set[str]:
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
