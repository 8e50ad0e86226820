"""consumer.py and retry_consumer.py side by side on one private broker: the harness's part of every
retry-topics run.

    with kafka_backend.private() as endpoint:
        create_topics(endpoint)
        shared, main_view, retry_view = clock.pair_clocks(lab.MAIN_SCRIPT, lab.RETRY_SCRIPT)
        with LivePair(learner, endpoint, app, main_view, retry_view, cancelled) as live:
            live.wait_fetching()                    # both groups joined and assigned (see below)
            placed = produce_callbacks(endpoint, layout)
            live.settle(done=..., cap=...)          # until done, quiet, capped or out of time
            main, retry = live.stop_and_collect()
        state = read_state(endpoint)

`LivePair` runs both scripts with ONE application (`app`, e.g. a NotifierApp: calls are counted per order
across both processes) and one shared virtual clock (each run gets its own ClockView of it: clock.py).
`settle` is the stop policy of a pair; a check with another scenario (a kill and restart) may drive the pair
itself: `live.watch` shows both runs' live Progress, `live.stop(Stop)` ends both, `live.running(script)` says
whether a run is still going.

Groups stable: a consumer sends Fetch requests only for partitions it has been assigned, so a script's first
Fetch (on its own relay: one per run) means its group has joined, synced and fetched its offsets. That needs
no reading of group state from the broker (Tansu's DescribeGroups shows no members) and covers every client
and a consumer that assign()s its partitions. The harness produces only once both scripts fetch (or have
ended, or FETCH_LIMIT passed: a late joiner with auto.offset.reset earliest still gets everything), so a
consumer on `latest` with nothing committed yet still sees every record.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from retrylab.background import Beside, without_step_clock
from retrylab.checks.retry_topics import lab
from retrylab.checks.retry_topics.catalog import tr
from retrylab.checks.retry_topics.records import acked
from retrylab.fixtures.retry_topics import callbacks as factory
from retrylab.runner import ScriptRun
from retrylab.settle import Reason, Stop, StopCondition, no_progress

FETCH = 1                   # the Kafka API key of Fetch
# session.timeout.ms of the learner's consumers (the redirect caps it): a join takes about 2 s on Tansu at
# 3000 ms against 3.3 s at 6000, and a consumer's heartbeats (every second) come from its client's own thread
SESSION_TIMEOUT_MS = 3000
# real seconds to wait for a consumer's first Fetch once it has sent its first request (a join takes ~2 s);
# before that request a busy machine may still be starting its interpreter: up to START_LIMIT in all
FETCH_LIMIT = 15.0
START_LIMIT = 30.0
QUIET = 3.0                 # real seconds without change (calls, records, commits) while the learner was idle
QUIET_COMMITS = 6.5         # ... when every expected call is made but offsets lag: auto-commit runs every 5 s
DONE_SETTLE = 0.5           # real seconds the outcome must stay complete (an extra call would show by then)
SETTLE_LIMIT = 25.0         # real seconds from the first callback produced to the end, at most, ...
# ... or this many while the run's clock still moves toward what a correct pair waits for (ClockWatch): a retry
# consumer that pauses its partitions and polls toward its due time moves the clock a slice of real time at a time
# (brokers/kafka/redirect.py), and a busy machine stretches every slice. With learners run a quarter of the time
# (bench/load_agreement.py --freeze 0.03 --thaw 0.01), correct/kafka-python-flat-merge-pause-poll ran into the 25 s
# of both of step 7's halves and failed it
MOVING_LIMIT = 50.0
MOVING = 1.0                # real seconds since the clock last moved within which it still counts as moving
MOVING_SPAN = lab.MAX_ATTEMPTS * lab.INTERVAL   # virtual seconds: a correct pair's wait moves it (attempts - 1)
# intervals at most (measured: 1200 s in the main run, 600 s to the hang and 600-1200 s after the restart); a clock
# moved further is waiting for nothing due (a retry a hundred years ahead, retries without end)
# virtual seconds per real second: a wait cut by its moving limit while the clock moved at least this fast toward a
# due time cut a pair still at work, which is not judged (LivePair.cut, observe.incomplete). Correct pairs keep
# 125-230 on a quiet machine (each wait of a grading, all three pause-and-poll entries); run 8 times slower, 16-29
# (10-11 polling at 50 ms, and a wait of step 7 under 10 once). A pair polling toward its due time slower than this
# (1 ms timeouts: about 1 per second) is judged as it stands
MIN_PACE = 5.0
STUCK_CPU = 3.0             # CPU seconds of one script without a change (_Stuck): it spins
LOOK = 0.05                 # real seconds between two looks of `settle`
RUN_TIMEOUT = START_LIMIT + MOVING_LIMIT + 5.0      # a run's outer bound in the runner (never reached normally)


@dataclass(frozen=True)
class Cut:
    """A wait of the harness ended by its moving limit while the pair's clock still moved (ClockWatch.cut)."""
    pace: float         # virtual seconds per real second since the clock first moved in the wait (ClockWatch.pace)
    clock: float        # the run's virtual epoch seconds then: a retry due later was still to come
    limit: float        # the real seconds the wait lasted (its moving limit)


class ClockWatch:
    """The run's clock during one wait of the harness: when it last moved, and whether it still moves toward what a
    correct pair waits for (it moved in the last MOVING real seconds, and by less than MOVING_SPAN in all)."""

    def __init__(self, now: float):
        self.start: float | None = None
        self.offset: float | None = None
        self.moved = now
        self.first_move: float | None = None    # real time the clock first moved in this wait
        self.moving = False

    def look(self, offset: float, now: float) -> bool:
        if self.start is None:
            self.start = offset
        if offset != self.offset:
            self.offset, self.moved = offset, now
            if self.first_move is None and offset != self.start:
                self.first_move = now
        self.moving = now - self.moved < MOVING and offset - self.start < MOVING_SPAN
        return self.moving

    def pace(self, now: float) -> float:
        """Virtual seconds the clock moved per real second since it first moved in this wait (before that, the pair
        handles records in real time: with learners 8 times slower, a correct pair polling at 50 ms kept 10.4 while
        it moved, and less counted from the start of step 7's wait for the hang, which failed it). Over MOVING s at
        least: one jump is no pace."""
        if self.first_move is None or now <= self.first_move:
            return 0.0
        return (self.offset - self.start) / max(now - self.first_move, MOVING)

    def cut(self, now: float, virtual_now: float, limit: float, moving_limit: float) -> Cut | None:
        """A wait (of `limit`, or `moving_limit` while the clock moves) ended now by its limit: the Cut, if that cut a
        pair still at work (at the last look its clock still moved toward a due time, in a wait with a moving limit).
        None: the pair was not at work (its clock stood still, or never moved in this wait)."""
        if moving_limit <= limit or not self.moving or self.offset == self.start:
            return None
        return Cut(self.pace(now), virtual_now, moving_limit)


def out_of_time(elapsed: float, limit: float, moving_limit: float, moving: bool) -> bool:
    """Whether a wait of `elapsed` real seconds is over: past `limit`, unless the clock still moves toward a due
    time (ClockWatch.look) and `moving_limit` is not reached yet."""
    return elapsed >= max(limit, moving_limit) or (elapsed >= limit and not moving)


@dataclass(frozen=True)
class Placed:
    """A callback the harness produced, where it landed (the broker's delivery report)."""
    callback: dict
    partition: int
    offset: int

    @property
    def order(self) -> str:
        return self.callback["orderId"]


def learner_endpoint(endpoint):
    """The endpoint to run the pair on: learner consumers get session.timeout.ms SESSION_TIMEOUT_MS at most."""
    return dataclasses.replace(endpoint, learner_session_timeout_ms=SESSION_TIMEOUT_MS)


def create_topics(endpoint) -> None:
    endpoint.create_topics(lab.PARTITIONS)


def produce_callbacks(endpoint, layout: list[list[dict]]) -> list[Placed]:
    """Produce `layout[p]` (callbacks, in order) to partition p of callbacks, keyed by order id; one record
    per callback. The partition is chosen by the harness so that every partition gets records and a
    failing callback has others behind it (a key's callbacks must share a partition: the layout keeps that)."""
    placed = []
    for partition, batch in enumerate(layout):
        if not batch:
            continue
        landed = endpoint.produce(lab.TOPIC, [(factory.key(c), factory.payload(c)) for c in batch], partition=partition)
        placed += [Placed(c, p, offset) for c, (p, offset) in zip(batch, landed)]
    return placed


def ends_of(placed: list[Placed]) -> dict[tuple[str, int], int]:
    """(callbacks, partition) -> the offset after its last record: where a committed offset must be."""
    ends: dict[tuple[str, int], int] = {}
    for p in placed:
        ends[(lab.TOPIC, p.partition)] = max(ends.get((lab.TOPIC, p.partition), 0), p.offset + 1)
    return ends


def produced_ends(requests, topic: str) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the offset after the last record the learner produced there, from the broker's
    answers to its Produce requests (the relays' record; never from watermarks)."""
    ends: dict[tuple[str, int], int] = {}
    for name, partition, base, records, _at in acked(requests):
        if name == topic:
            ends[(name, partition)] = max(ends.get((name, partition), 0), base + records)
    return ends


class PairWatch:
    """The two runs as they go on: each run's stop condition hands its live Progress here at every look
    (so the harness can read that run's relay and calls), and ends its run once `stop` is set."""

    def __init__(self, cancelled: threading.Event):
        self.cancelled = cancelled
        self.progress: dict[str, object] = {}       # script -> its run's live retrylab.runner.Progress
        self.fetching: dict[str, float] = {}        # script -> real time of its first Fetch request
        self.started: dict[str, float] = {}         # script -> real time of its first request
        self._seen: dict[str, int] = {}             # script -> requests of its relay looked at so far
        self.stopped: Stop | None = None
        self._lock = threading.Lock()

    def condition(self, script: str) -> StopCondition:
        return _PairCondition(self, script) | _Stuck(self)

    def look(self, script: str, progress) -> None:
        with self._lock:
            self.progress.setdefault(script, progress)
            if script in self.fetching:
                return
            requests = progress.link.relay.requests()
            if requests and script not in self.started:
                self.started[script] = requests[0].at
            for request in requests[self._seen.get(script, 0):]:
                if request.api_key == FETCH:
                    self.fetching[script] = request.at
                    break
            self._seen[script] = len(requests)

    def stop(self, stop: Stop) -> None:
        with self._lock:
            if self.stopped is None:
                self.stopped = stop

    def calls(self) -> list:
        return [c for p in list(self.progress.values()) for c in p.calls()]

    def signature(self) -> tuple:
        """What changes when a script does something: records produced, offsets committed, group or topic
        changes (each relay's shape) and calls of the application."""
        return tuple((script, p.link.shape(), len(p.channel.record)) for script, p in sorted(self.progress.items()))

    def clock(self) -> float:
        """The shared clock's offset: a retry consumer that waits for a due time by polling a paused
        partition moves it a poll timeout at a time, with nothing else to show for minutes of virtual time."""
        return max((p.channel.clock.offset for p in list(self.progress.values())), default=0.0)

    def busy(self) -> bool:
        """A thread of a learner process is running or waiting for a CPU (on a busy machine: not idle)."""
        return any(p.sandbox is not None and p.sandbox.learner_running() for p in list(self.progress.values()))

    def requests(self) -> list:
        """Every request of both scripts so far (each relay's record)."""
        return [r for p in list(self.progress.values()) for r in p.link.relay.requests()]

    def committed(self) -> dict[tuple[str, str, int], int]:
        """(group, topic, partition) -> the last offset the scripts committed, as their requests said."""
        found: dict = {}
        for p in list(self.progress.values()):
            found.update(p.link.relay.committed())
        return found


class _PairCondition(StopCondition):
    def __init__(self, watch: PairWatch, script: str):
        self.watch, self.script = watch, script

    def check(self, progress) -> Stop | None:
        self.watch.look(self.script, progress)
        if self.watch.cancelled.is_set():
            return Stop(Reason.CANCELLED)
        return self.watch.stopped


class _Stuck(StopCondition):
    """no_progress(cpu=STUCK_CPU) for one script of a pair, where the shared clock moving counts as a change while it
    has moved by less than MOVING_SPAN since the script's last change (calls, records, commits, group changes): a
    paused retry consumer polling toward its due time with short timeouts pays CPU for every poll (measured: one
    polling at 50 ms ran 3 CPU-s while the clock moved 420 s, and was stopped as spinning). A spin that does not
    move the clock, or moves it without end, is stopped as before."""

    def __init__(self, watch: PairWatch):
        self.watch = watch
        self.startup = no_progress(cpu=STUCK_CPU)      # its CPU before its first broker command, as no_progress
        self.changes = -1                              # the run's change count (Progress.changes) last seen
        self.changed: float | None = None              # the clock at the script's last change
        self.moved = (0.0, 0.0)                        # (the clock, the script's CPU) when it last counted

    def check(self, progress) -> Stop | None:
        if not progress.started():
            return self.startup.check(progress)
        clock, cpu = self.watch.clock(), progress.cpu()
        if progress.changes != self.changes:
            self.changes, self.changed, self.moved = progress.changes, clock, (clock, cpu)
        elif clock != self.moved[0] and clock - self.changed < MOVING_SPAN:
            self.moved = (clock, cpu)
        used = cpu - self.moved[1]
        return Stop(Reason.NO_PROGRESS, f"{used:.1f}") if used >= STUCK_CPU else None


@dataclass
class PairTimes:
    """Where a pair's real time went (seconds), for benchmarks."""
    fetching: dict[str, float] = field(default_factory=dict)   # script -> from its start to its first Fetch
    waited_for_fetch: float = 0.0
    settle: float = 0.0         # from the first callback produced to the stop
    stop: float = 0.0           # from the stop to both runs' records


class LivePair:
    """Both scripts running, each in a thread of its own (a learner run blocks its caller)."""

    def __init__(self, learner, endpoint, app, main_clock, retry_clock, cancelled: threading.Event | None = None,
                 scripts: tuple[str, str] = (lab.MAIN_SCRIPT, lab.RETRY_SCRIPT), timeout: float = RUN_TIMEOUT):
        self.learner = without_step_clock(learner)
        self.endpoint = endpoint
        self.app = app
        self.clocks = dict(zip(scripts, (main_clock, retry_clock)))
        self.scripts = scripts
        self.timeout = timeout
        self.watch = PairWatch(cancelled or threading.Event())
        self.times = PairTimes()
        self._ended: dict[str, threading.Event] = {s: threading.Event() for s in scripts}
        self._runs: dict[str, Beside] = {}
        self._started = 0.0
        self.cut: Cut | None = None     # settle's limit cut the pair while its clock still moved; None: not so

    def __enter__(self) -> LivePair:
        self._started = time.time()
        for script in self.scripts:
            self._runs[script] = Beside(lambda cancelled, script=script: self._run(script), f"retrylab-pair-{script}")
        return self

    def _run(self, script: str) -> ScriptRun:
        try:
            return self.learner.run(script, self.endpoint, timeout=self.timeout, stop_when=self.watch.condition(script),
                                    app=self.app, run_clock=self.clocks[script])
        finally:
            self._ended[script].set()

    def __exit__(self, *exc) -> None:
        self.watch.stop(Stop(Reason.CANCELLED))
        for run in self._runs.values():
            run.cancel()   # its own event is unused: the watch stopped it; cancel() bounds the wait

    def running(self, script: str) -> bool:
        return not self._ended[script].is_set()

    def wait_fetching(self, limit: float = FETCH_LIMIT, start_limit: float = START_LIMIT) -> dict[str, float | None]:
        """Wait until each script still running has sent its first Fetch: at most `limit` real seconds after
        the later first request of the two (a loaded machine starts interpreters slowly: that is not counted),
        and `start_limit` in all. Returns script -> real time of its first Fetch (None: none yet)."""
        began, wall = time.monotonic(), time.time()
        while not self.watch.cancelled.is_set():
            waiting = [s for s in self.scripts if s not in self.watch.fetching and self.running(s)]
            if not waiting:
                break
            latest = max([wall, *self.watch.started.values()])
            if time.time() - latest >= limit or time.monotonic() - began >= start_limit:
                break
            time.sleep(LOOK / 2)
        self.times.waited_for_fetch = time.monotonic() - began
        self.times.fetching = {s: at - self._started for s, at in self.watch.fetching.items()}
        return {s: self.watch.fetching.get(s) for s in self.scripts}

    def settle(self, done: Callable[[PairWatch], bool], cap: Callable[[PairWatch], str | None],
               work_done: Callable[[PairWatch], bool] = lambda watch: False, limit: float = SETTLE_LIMIT,
               moving_limit: float = MOVING_LIMIT) -> Stop:
        """Watch both runs until one of: `done(watch)` stayed true for DONE_SETTLE (the outcome is complete);
        `cap(watch)` names a reason to stop (retrying without end, a flood); nothing changed for QUIET seconds
        while no learner thread was running (QUIET_COMMITS when `work_done`: the calls are all made and an
        auto-commit may still come); both runs ended; `limit` real seconds, or `moving_limit` while the clock
        moves (out_of_time: `cut` says if that cut a pair still at work). Then stop both; returns why."""
        began = time.monotonic()
        signature, changed, done_since = None, began, None
        # neither the clock moving nor a learner thread running (or waiting for a CPU) is work done, but
        # neither is quiet: the first is a paused retry consumer waiting for its due time, the second a busy machine
        clock, active = ClockWatch(began), began
        stop = None
        while stop is None:
            now = time.monotonic()
            moving = clock.look(self.watch.clock(), now)
            if self.watch.cancelled.is_set():
                stop = Stop(Reason.CANCELLED)
            elif not any(self.running(s) for s in self.scripts):
                stop = Stop(Reason.EXITED)
            elif out_of_time(now - began, limit, moving_limit, moving):
                self.cut = clock.cut(now, self.clocks[self.scripts[0]].now(), limit, moving_limit)
                stop = Stop(Reason.CAP, tr("pair.limit", seconds=f"{now - began:.0f}"))
            else:
                current = self.watch.signature()
                if current != signature:
                    signature, changed = current, now
                if self.watch.busy():
                    active = now
                capped = cap(self.watch)
                if capped:
                    stop = Stop(Reason.CAP, capped)
                elif done(self.watch):
                    done_since = done_since if done_since is not None and changed <= done_since else now
                    if now - done_since >= DONE_SETTLE:
                        stop = Stop(Reason.DONE_WAITED, f"{now - done_since:.1f}")
                else:
                    done_since = None
                    quiet = QUIET_COMMITS if work_done(self.watch) else QUIET
                    if now - max(changed, clock.moved, active) >= quiet:
                        stop = Stop(Reason.CAP, tr("pair.quiet", seconds=f"{quiet:g}"))
            if stop is None:
                time.sleep(LOOK)
        self.times.settle = time.monotonic() - began
        return stop

    def stop(self, stop: Stop) -> None:
        self.watch.stop(stop)

    def stop_and_collect(self, stop: Stop | None = None) -> tuple[ScriptRun, ScriptRun]:
        """End both runs (if still going) and return their records, in the order of `scripts`."""
        began = time.monotonic()
        self.watch.stop(stop or Stop(Reason.CANCELLED))
        runs = tuple(self._runs[s].result() for s in self.scripts)
        self.times.stop = time.monotonic() - began
        return runs
