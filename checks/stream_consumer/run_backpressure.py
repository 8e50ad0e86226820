"""Step 6's run: producer.py --count N --max-lag M against consumer.py, which drains slower than it could add.

On a private Redis with group `workers` made at id 0 (LAB.md), consumer.py runs in a thread beside the
grading (its effects each take EFFECT_PAUSE real seconds, so it drains at a known slow rate, but for one
early effect that takes longer: a hiccup that a producer ignoring the lag cannot hide), and a second
thread samples the group's lag (undelivered + pending) every SAMPLE_PERIOD. Once the consumer reads (it
sent XREADGROUP), producer.py runs with N and M drawn for this grading: so the consumer drains while the
producer adds or refuses, and a refusal while the lag has fallen shows. When it exits, the consumer is left to
drain (held DONE_GRACE) and stopped. A producer that does not finish is stopped: once the group has been
drained for HANG_GRACE real seconds while it still runs (it waits for a lag that is already gone), when
the consumer is gone, when it has run longer than a quiet machine needs and the consumer it may be waiting on
has applied nothing for PRODUCER_SLACK, or at its own outer bound. Time bounds follow the consumer's pace:
on a busy machine the consumer drains slowly, and a blocking producer rightly waits for it.

The record is everything the check needs and nothing the learner's scripts could fake: the harness's lag
samples, the entries left in `orders` and XINFO STREAM's entries-added (so entries that were trimmed or
deleted count as added), effects per order id from the call log, refusals read from `orders:refused`
(refusals.py says which shapes are accepted) each with the relay's time of the producer command that
wrote it, and the commands that trimmed `orders` (XTRIM, XADD ... MAXLEN|MINID, or a script naming them).
"""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest
import redis

from retrylab.background import Beside, without_step_clock
from retrylab.appchannel import RunClock
from retrylab.checks.stream_consumer.runs import RUNS
from retrylab.checks.stream_consumer import lab, refusals, streams
from retrylab.checks.stream_consumer.catalog import tr
from retrylab.checks.stream_consumer.settling import BUSY_FACTOR, consumer_settled, held_for
from retrylab.fixtures.stream_consumer.effects_app import EffectsApp
from retrylab.runner import ScriptRun
from retrylab.settle import Reason, when

COUNTS = (60, 90)           # N, drawn per grading: enough orders for the lag to reach M many times over
MAX_LAGS = (10, 20)         # M, drawn per grading
EFFECT_PAUSE = 0.012        # real seconds per effect: the consumer drains ~65 orders/s, a producer adds far faster
SAMPLE_PERIOD = 0.03        # seconds between two of the harness's lag samples
JOIN_WAIT = 8.0             # real seconds the harness waits for consumer.py to read from the group, from when
                            # its run is under way: an interpreter importing redis on a loaded machine takes seconds
START_WAIT = 60.0           # real seconds for the run to get under way (a sandbox on a busy machine)
HANG_GRACE = 1.0            # real seconds the group stays drained while producer.py runs on: it hangs
PRODUCER_SLACK = 4.0        # real seconds a producer may take beyond what draining N orders takes, and may run
                            # on past that with the consumer applying nothing
DRAIN_BOUND = 3.0           # real seconds the consumer has, once the producer has ended or since its last effect,
                            # to drain what is left
# One early effect (which one is drawn per grading) takes (M + 5) / STALL_RATE seconds: the consumer
# hiccups while the producer is still adding. A producer that does not look at the lag then overruns
# max(M + 5, 1.2 M) whatever its pace, unless it adds fewer than STALL_RATE orders a second: slower than
# the consumer takes them (~65/s), so never pressed. It costs the reference (M + 5) / STALL_RATE s of waiting.
STALL_RATE = 45.0
STALL_AT = (1, 8)


@dataclass(frozen=True)
class LagSample:
    t: float                # epoch seconds (the relay's command times are too)
    lag: int                # undelivered + pending


@dataclass(frozen=True)
class TimedRefusal:
    refusal: refusals.Refusal
    at: float | None        # when the producer sent the command that wrote it (None: no command of its did)


@dataclass(frozen=True)
class BackpressureRun:
    count: int                          # N
    max_lag: int                        # M
    consumer: ScriptRun
    consumer_joined: bool               # consumer.py read from the group before the harness gave up waiting
    producer: ScriptRun | None          # None: not run (consumer.py never joined the group)
    producer_stopped: str | None        # why the harness stopped it: "idle" (the lag was gone for HANG_GRACE),
                                        # "consumer_gone", "stalled"; None: it exited, or ran into its
                                        # outer bound
    producer_window: tuple[float, float]  # epoch seconds: when producer.py started and ended
    samples: tuple[LagSample, ...]
    entries: tuple[streams.Entry, ...]  # what is left in `orders` (at most streams.MAX_ENTRIES)
    stream_length: int                  # XLEN orders
    entries_added: int                  # XINFO STREAM entries-added: every entry ever added, trimmed or not
    effects: Counter                    # order id -> effects applied
    refusals: tuple[TimedRefusal, ...]
    refused_type: str | None            # `orders:refused` is of a type no shape accepts
    trims: tuple[str, ...]              # commands (shown) that trimmed `orders`


class _Either:
    """Set when either event is (a grading that ends, or a thread's own stop)."""

    def __init__(self, *events: threading.Event):
        self.events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


def _sample_lag(endpoint, stop: threading.Event, cancelled: threading.Event) -> list[LagSample]:
    samples: list[LagSample] = []
    with endpoint.client() as client:
        next_at = time.monotonic()
        while not (stop.is_set() or cancelled.is_set()):
            try:
                state = streams.group(client)
            except redis.RedisError:   # a learner's odd key: no sample this time
                state = None
            else:
                samples.append(LagSample(time.time(), state.lag if state else 0))
            next_at += SAMPLE_PERIOD
            stop.wait(max(0.0, next_at - time.monotonic()))
    return samples


class _Hiccup:
    """EffectsApp's on_call: the `at`-th call of effects.apply takes `stall` seconds, the others EFFECT_PAUSE
    (EffectsApp reads its `pause` for each call's answer after telling on_call). It notes when the consumer
    last called (`last_at`, monotonic): its pace, which the time bounds follow."""

    def __init__(self, app: EffectsApp, at: int, stall: float):
        self.app, self.at, self.stall, self.calls = app, at, stall, 0
        self.last_at: float | None = None
        self._lock = threading.Lock()

    def since_last(self, start: float) -> float:
        """Real seconds since the consumer's last call of apply, or since `start` if that was later."""
        return time.monotonic() - max(start, self.last_at or start)

    def __call__(self, order_id: str, failed: bool) -> None:
        with self._lock:
            self.calls += 1
            self.last_at = time.monotonic()
            self.app.pause = self.stall if self.calls == self.at else EFFECT_PAUSE


def effects_with_hiccup(at: int, stall: float) -> EffectsApp:
    app = EffectsApp(pause=EFFECT_PAUSE)
    app.on_call = _Hiccup(app, at, stall)
    return app


def _drained(client) -> bool:
    state = streams.group(client)
    return state is not None and state.pending == 0 and state.undelivered == 0


def _consumer_stop(client, producer_done: threading.Event, reading: threading.Event, running: threading.Event,
                   stop, pace: _Hiccup) -> object:
    """consumer.py's stop: done once the producer has ended and the group is drained (held DONE_GRACE);
    or, drained or not, once it has applied nothing for DRAIN_BOUND since the producer ended (what is left is
    the check's to judge)."""
    ended_at: list[float | None] = [None]

    def done(progress) -> bool:
        return producer_done.is_set() and _drained(client)

    def gave_up(progress) -> bool:
        if not producer_done.is_set():
            return False
        ended_at[0] = ended_at[0] or time.monotonic()
        return pace.since_last(ended_at[0]) > DRAIN_BOUND

    return (_notes_reading(reading, running) | consumer_settled(done, stop)
            | when(gave_up, Reason.CAP, lambda p: tr("step6.stopped_drain", seconds=DRAIN_BOUND)))


def _producer_stop(client, consumer_gone: threading.Event, why: list[str], pace: _Hiccup, quiet_bound: float):
    """producer.py's stop, beyond its outer bound: the group has been drained for HANG_GRACE while it runs
    on (it waits for a lag that is gone), consumer.py has ended (the lag can no longer fall), or it has run
    longer than `quiet_bound` (what a quiet machine needs) while consumer.py, which a blocking producer waits
    on, has applied nothing for PRODUCER_SLACK. `why` gets "idle", "consumer_gone" or "stalled"."""
    def noted(name, predicate):
        def look(progress) -> bool:
            if predicate(progress):
                why.append(name)
                return True
            return False
        return look

    idle = held_for(lambda progress: progress.started() and _drained(client), HANG_GRACE)
    first_look: list[float | None] = [None]

    def stalled(progress) -> bool:
        if first_look[0] is None:
            first_look[0] = time.monotonic()
        return time.monotonic() - first_look[0] > quiet_bound and pace.since_last(first_look[0]) > PRODUCER_SLACK

    return (when(noted("idle", idle), Reason.CAP, lambda p: tr("step6.stopped_idle", seconds=HANG_GRACE))
            | when(noted("consumer_gone", lambda p: consumer_gone.is_set()), Reason.CAP,
                   lambda p: tr("step6.stopped_consumer_gone"))
            | when(noted("stalled", stalled), Reason.CAP,
                   lambda p: tr("step6.stopped_stalled", seconds=f"{quiet_bound:g}", slack=f"{PRODUCER_SLACK:g}")))


def _notes_reading(reading: threading.Event, running: threading.Event):
    """A condition that never stops the run: it sets `running` when the runner first looks at the run (its
    process is up), and `reading` once the consumer has sent XREADGROUP (Redis 7.0 makes no consumer in the
    group for a read that found nothing, so XINFO cannot tell)."""
    seen = [0]     # commands already looked at

    def look(progress) -> bool:
        running.set()
        if not reading.is_set():
            commands = progress.commands()
            if any(c.name == "XREADGROUP" for c in commands[seen[0]:]):
                reading.set()
            seen[0] = len(commands)
        return False
    return when(look, Reason.CAP)


def _wait_for_consumer(reading: threading.Event, running: threading.Event, consumer_gone: threading.Event,
                       cancelled) -> bool:
    """Whether consumer.py reads from the group (it sent XREADGROUP) within JOIN_WAIT of its run being
    under way (the sandbox made and the process started: START_WAIT at most)."""
    _wait_for(running, START_WAIT, cancelled, consumer_gone)
    _wait_for(reading, JOIN_WAIT, cancelled, consumer_gone)
    return reading.is_set()


def _wait_for(event: threading.Event, seconds: float, *unless: threading.Event) -> None:
    """Until `event` is set, one of `unless` is, or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while not (event.is_set() or any(e.is_set() for e in unless)) and time.monotonic() < deadline:
        event.wait(0.02)


@RUNS.observer("backpressure_run")
def observe_backpressure(learner, redis_backend, cancelled: threading.Event) -> BackpressureRun:
    count, max_lag = random.randint(*COUNTS), random.randint(*MAX_LAGS)
    quiet_bound = count * EFFECT_PAUSE * 2 + PRODUCER_SLACK
    producer_timeout = quiet_bound * BUSY_FACTOR
    with redis_backend.private() as endpoint, endpoint.client() as client:
        streams.create_group(client)
        producer_done, consumer_gone, reading, running = (threading.Event(), threading.Event(), threading.Event(),
                                                          threading.Event())
        producer_stopped: list[str] = []

        effects = effects_with_hiccup(random.randint(*STALL_AT), (max_lag + 5) / STALL_RATE)
        pace = effects.on_call

        def consume(stop: threading.Event) -> ScriptRun:
            try:
                return without_step_clock(learner).run(
                    "consumer.py", endpoint, timeout=JOIN_WAIT + producer_timeout + DRAIN_BOUND * BUSY_FACTOR + 1.0,
                    stop_when=_consumer_stop(client, producer_done, reading, running, _Either(stop, cancelled), pace),
                    app=effects, run_clock=RunClock.real())
            finally:
                consumer_gone.set()

        with Beside(lambda stop: _sample_lag(endpoint, stop, cancelled), "retrylab-lag-samples") as sampler, \
                Beside(consume, "retrylab-consumer") as consumer:
            joined = _wait_for_consumer(reading, running, consumer_gone, cancelled)
            producer, started = None, time.time()
            if joined and not cancelled.is_set():
                producer = learner.run("producer.py", endpoint, timeout=producer_timeout,
                                       stop_when=_producer_stop(client, consumer_gone, producer_stopped, pace,
                                                                quiet_bound),
                                       run_clock=RunClock.real(),
                                       args=("--count", str(count), "--max-lag", str(max_lag)))
            ended = time.time()
            producer_done.set()
            if producer is None:
                consumer.cancelled.set()
            consumer_run = consumer.result()
            samples = sampler.stop()
        found, refused_type = refusals.read(client)
        times = _refusal_times(producer.commands if producer else ())
        is_stream = streams.key_type(client, lab.STREAM) == "stream"
        return BackpressureRun(
            count=count, max_lag=max_lag, consumer=consumer_run, consumer_joined=joined, producer=producer,
            producer_stopped=producer_stopped[0] if producer_stopped else None,
            producer_window=(started, ended), samples=tuple(samples),
            entries=tuple(streams.entries(client, lab.STREAM)),
            stream_length=client.xlen(lab.STREAM) if is_stream else 0,
            entries_added=_entries_added(client) if is_stream else 0,
            effects=Counter(c.id for c in consumer_run.calls if c.outcome == "ok"),
            refusals=tuple(TimedRefusal(r, times.get(r.order_id) if r.order_id else None) for r in found),
            refused_type=refused_type,
            trims=tuple(_shown(c) for run in (producer, consumer_run) if run for c in run.commands if _trims(c)))


def _entries_added(client) -> int:
    info = client.xinfo_stream(lab.STREAM)
    return int(info.get("entries-added") or info.get(b"entries-added") or 0)


def _refusal_times(commands) -> dict[str, float]:
    """Order id -> the time of the first producer command that names `orders:refused` and that id: as an
    argument of its own (a stream's field value, a hash's field), or as the order_id of a JSON argument."""
    key, times = lab.REFUSED.encode(), {}
    for command in commands:
        if key not in command.args[1:]:
            continue
        for arg in command.args[2:]:
            times.setdefault(streams.text(arg), command.at)
            if arg[:1] == b"{":
                order_id = refusals.json_order_id(arg)
                if order_id is not None:
                    times.setdefault(order_id, command.at)
    return times


_TRIM_OPTIONS = (b"MAXLEN", b"MINID")


def _trims(command) -> bool:
    """Whether `command` trims `orders`: XTRIM, XADD with MAXLEN/MINID, or a script that does either."""
    args, name, key = command.args, command.name, lab.STREAM.encode()
    if name == "XTRIM":
        return len(args) > 1 and args[1] == key
    if name == "XADD" and len(args) > 2 and args[1] == key:
        options = args[3:] if args[2].upper() == b"NOMKSTREAM" else args[2:]   # options come before the id
        return bool(options) and options[0].upper() in _TRIM_OPTIONS
    if name in ("EVAL", "EVAL_RO", "FUNCTION") and len(args) > 1:
        script = args[1].upper()
        return b"XTRIM" in script or (b"XADD" in script and any(o in script for o in _TRIM_OPTIONS))
    return False


def _shown(command, limit: int = 80) -> str:
    text = " ".join(a.decode("utf-8", "replace") for a in command.args)
    return text if len(text) <= limit else text[:limit - 1] + "…"


@pytest.fixture(scope="session")
def backpressure_run(request, learner, redis_backend):
    return RUNS.record(request, "backpressure_run", learner, redis_backend)
