"""Step 7's run (and the advanced checks bounded-concurrency and quiet-wait, which watch its first half):
both consumers killed with SIGKILL in the middle of a retry, then started again.

On a private broker of its own, the two consumers as a pair (pair.py: one NotifierApp, one shared virtual
clock, callbacks produced once both fetch), with a session timeout of SESSION_MS (a killed member holds its
partitions until its session ends: a restart takes 1.4-4.5 s at 2000 ms, 12 s at 6000):

1. Once both groups read their partitions, the harness produces `ok`, the target (merchant `down`), `ok`.
   The target fails at once; its first retry (the 2nd call) hangs: the retry consumer blocks there, in real
   time, and cannot take anything else. Meanwhile retry_consumer.py's CPU is sampled while the target's
   retry is pending and not due (quiet-wait).
2. Then a second batch: `ok`s, `flaky-1`, `flaky-2`, `down` and a burst of BURST more `down`s, whose first
   retries would hang too (where a thread per failure makes them at once). consumer.py handles them all
   (notify, retry records, commits) while their retries pend on callbacks.retry, behind the hung one. The
   threads of both scripts are sampled (bounded-concurrency). retry_consumer.py has committed nothing yet:
   a group without a commit that starts at `latest` after the restart skips every one of those retries.
3. Once the main group has committed the ends of its partitions (and the hang has lasted HANG_HELD, two
   auto-commits of AUTO_COMMIT_MS), both consumers are killed at once
   (SIGKILL), the hang is disarmed, and both start again on the same broker and the same clock (which never
   goes back: the restarted processes take it where the killed ones left it). The run ends once every
   callback has had all its attempts and held still for a moment, or nothing more happens for QUIET s.

What a kill can lose or repeat is then in the call log (both halves share one NotifierApp, so the calls of
an order are counted across the restart) and in the topics.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from dataclasses import dataclass

import pytest

from retrylab.brokers.kafka.state import KafkaState, read_state
from retrylab.checks.retry_topics import durability, lab, pair, waiting
from retrylab.checks.retry_topics.clock import pair_clocks
from retrylab.checks.retry_topics.hangs import HangingRetries
from retrylab.checks.retry_topics.runs import RUNS
from retrylab.fixtures.retry_topics.callbacks import new_callback
from retrylab.fixtures.retry_topics.notifier_app import NotifierApp
from retrylab.runner import ScriptRun
from retrylab.settle import Reason, Stop

SESSION_MS = 2000       # kill to both restarted consumers' first Fetch (bench/retry_topics_durable_bench.py): 1.4 s or
# 4.3 s (a join alone, or waiting out the killed member) on a quiet machine, 2.1-3.4 s at load 17-28; 1500 and
# 3000 alike within noise, 6000: 11.5-13.7 s. No session expired under load at 2000 (one JoinGroup round each)
BURST = 6               # more `down` callbacks in the second batch (every one costs the restart 2 retries, ~0.1 s each)
FAILURES = BURST + 3    # failing callbacks in the second batch, all at once (bounded-concurrency)
HANG_WAIT = 15.0        # real seconds after the first batch for the target's retry to come (and hang): a consumer that
                        # pauses and polls toward it takes 600 polls (each a virtual wait of 1 s) ...
HANG_LIMIT = 30.0       # ... or this many while the clock still moves (pair.out_of_time): a busy machine slows them
SPIN_CPU = 0.5          # CPU seconds of retry_consumer.py with the target's retry pending: enough to judge its wait
BATCH_WAIT = 6.0        # real seconds for consumer.py to handle and commit the second batch
SETTLE = 0.3            # real seconds left, once it has, for a thread started per failure to reach its retry
AUTO_COMMIT_MS = 500    # the learners' auto-commit interval at most (the redirect lowers the clients' 5 s) ...
HANG_HELD = 1.2         # ... and real seconds the hang lasts before the kill at least: an offset auto-committed
                        # before its record was handled (confluent-kafka's default) is committed by then
KILL_WAIT = 10.0        # real seconds for a killed run to be reaped (the supervisor's own budget is 5)
LOOK = 0.02             # real seconds between two looks (and samples) of the harness


@dataclass(frozen=True)
class Sample:
    at: float           # real epoch seconds
    virtual: float      # the shared clock then
    cpu: float          # CPU seconds the run's processes had so far
    threads: int        # threads of its processes then


@dataclass(frozen=True)
class Half:
    """One pair of runs, and what the harness sampled of them while they ran (the first half only)."""
    runs: dict[str, ScriptRun]
    samples: dict[str, tuple[Sample, ...]]
    fetching: dict[str, float | None]   # script -> real time of its first Fetch

    def committed(self, script: str) -> dict[tuple[str, str, int], int]:
        """(group, topic, partition) -> the last offset the script committed, as its requests said."""
        found = {}
        for request in self.runs[script].commands:
            for commit in request.commits:
                found[(commit.group, commit.topic, commit.partition)] = commit.offset
        return found


@dataclass(frozen=True)
class DurableRun:
    published: tuple[dict, ...]
    target: str                         # the order whose first retry hung
    burst: tuple[str, ...]              # the second batch's BURST `down` orders
    landed: dict[str, tuple[int, int]]  # order id -> (partition, offset) on callbacks
    first: Half                         # until the kill (or until the harness gave up waiting for the hang)
    second: Half | None                 # None: nothing was killed, so nothing restarted
    killed_at: float | None             # real epoch seconds of the kill
    hung: tuple[tuple[str, int], ...]   # (order, call number) of the calls that hung
    retry_produced_at: float | None     # real epoch seconds consumer.py produced the target's retry record
    hang_waited: float | None           # real seconds the harness waited for the target's retry to hang (or gave up)
    cut: pair.Cut | None                # a wait's limit cut the pair while its clock still moved (ClockWatch)
    batch_at: float | None              # real epoch seconds the second batch was produced (None: never)
    batch_handled: bool                 # the main group committed the second batch before the kill
    state: KafkaState | None            # the topics and commits at the end
    calls: tuple                        # every call of both halves, in the order of their virtual time

    def merchant(self, order: str) -> str:
        return next(c["merchant"] for c in self.published if c["orderId"] == order)

    def due_times(self) -> list[float]:
        """nextRetryTime (virtual epoch seconds) of every record on callbacks.retry."""
        found = [durability.lab_record(self, r).due for c in self.published
                 for r in durability.retry_records(self.state, c["orderId"])] if self.state is not None else []
        return [t for t in found if t is not None]

    @property
    def missing(self) -> str | None:
        return next((s for s, r in self.first.runs.items() if r.missing), None)


def _spread(batch: list[dict]) -> list[list[dict]]:
    """A batch over the three partitions of callbacks, in turn."""
    return [batch[p::lab.PARTITIONS[lab.TOPIC]] for p in range(lab.PARTITIONS[lab.TOPIC])]


class _Scenario:
    """The harness's side of the run, step by step (see the module's docstring)."""

    def __init__(self, learner, endpoint, cancelled: threading.Event):
        self.learner, self.endpoint, self.cancelled = learner, endpoint, cancelled
        ok = [new_callback(lab.OK) for _ in range(5)]
        self.target = new_callback(lab.DOWN)
        self.batch1 = [ok[0], self.target, ok[1]]
        burst = [new_callback(lab.DOWN) for _ in range(BURST)]
        self.batch2 = [ok[2], new_callback(lab.FLAKY_1), ok[3], new_callback(lab.FLAKY_2), new_callback(lab.DOWN),
                       ok[4]] + burst
        self.burst = [c["orderId"] for c in burst]
        self.notifier = NotifierApp(self.batch1 + self.batch2)
        self.app = HangingRetries(self.notifier)
        # every failing callback's first retry would hang: a thread per failure keeps one more thread per callback
        self.app.target(*(c["orderId"] for c in [self.target] + self.batch2 if c["merchant"] != lab.OK))
        self.shared, self.main_clock, self.retry_clock = pair_clocks(lab.MAIN_SCRIPT, lab.RETRY_SCRIPT)
        self.landed: dict[str, tuple[int, int]] = {}
        self.samples: dict[str, list[Sample]] = {}
        self.facts = dict(killed_at=None, retry_produced_at=None, hang_waited=None, batch_at=None, batch_handled=False,
                          cut=None)

    def _live(self) -> pair.LivePair:
        return pair.LivePair(self.learner, self.endpoint, self.app, self.main_clock, self.retry_clock, self.cancelled)

    def _produce(self, live: pair.LivePair, batch: list[dict]) -> None:
        """Produce `batch` over the partitions while consumer.py's fetches are held: its next poll returns the
        records of every partition at once, so a commit made for one partition's records while another's
        are not handled yet (commit() without offsets, after each partition) shows in every grading, not
        only when a fetch happened to come back between two partitions' produces."""
        progress = live.watch.progress.get(lab.MAIN_SCRIPT)
        held = progress.link.relay.fetches_held() if progress is not None else contextlib.nullcontext()
        with held:
            for placed in pair.produce_callbacks(self.endpoint, _spread(batch)):
                self.landed[placed.order] = (placed.partition, placed.offset)

    def _sample(self, live: pair.LivePair) -> None:
        for script, progress in list(live.watch.progress.items()):
            self.samples.setdefault(script, []).append(Sample(time.time(), self.shared.now(), progress.cpu(),
                                                              progress.sandbox.learner_threads()))

    def _until(self, live: pair.LivePair, predicate, seconds: float, moving_limit: float = 0.0) -> bool:
        """Wait (sampling) until `predicate()`, at most `seconds`, or `moving_limit` while the clock moves
        (pair.out_of_time); False on time, cancelled, or a run that ended. A wait cut by `moving_limit` while the
        pair's clock still moved sets the fact `cut`."""
        began = time.monotonic()
        clock = pair.ClockWatch(began)
        while not self.cancelled.is_set() and all(live.running(s) for s in live.scripts):
            now = time.monotonic()
            if pair.out_of_time(now - began, seconds, moving_limit, clock.look(live.watch.clock(), now)):
                self.facts["cut"] = self.facts["cut"] or clock.cut(now, self.shared.now(), seconds, moving_limit)
                break
            self._sample(live)
            if predicate():
                return True
            time.sleep(LOOK)
        return predicate()

    def first_half(self) -> Half:
        with self._live() as live:
            fetching = live.wait_fetching()
            if all(fetching.values()):
                self._up_to_the_kill(live)
            if self.facts["killed_at"] is None:
                live.stop(Stop(Reason.CANCELLED))
            self.app.disarm()
            runs = dict(zip(live.scripts, live.stop_and_collect()))
        return Half(runs, {s: tuple(v) for s, v in self.samples.items()}, fetching)

    def _up_to_the_kill(self, live: pair.LivePair) -> None:
        self._produce(live, self.batch1)
        began = time.monotonic()
        self._until(live, lambda: self.notifier.hung or self._retry_produced_at(live) is not None, HANG_WAIT,
                    HANG_LIMIT)
        self.facts["retry_produced_at"] = self._retry_produced_at(live)
        self._until(live, lambda: self.notifier.hung or self._spun(), HANG_WAIT, HANG_LIMIT)
        hung_at = time.monotonic()
        self.facts["hang_waited"] = hung_at - began
        self.facts["batch_at"] = time.time()
        self._produce(live, self.batch2)
        self.facts["batch_handled"] = self._until(live, lambda: self._batch_handled(live), BATCH_WAIT)
        self._until(live, lambda: False, max(SETTLE, HANG_HELD - (time.monotonic() - hung_at)))
        if self.notifier.hung and all(live.running(s) for s in live.scripts) and not self.cancelled.is_set():
            self.facts["killed_at"] = time.time()
            for progress in list(live.watch.progress.values()):
                progress.sandbox.kill()     # SIGKILL, both at once
            # both runs end as killed (not as stopped by the harness: that comes after)
            deadline = time.monotonic() + KILL_WAIT
            while any(live.running(s) for s in live.scripts) and time.monotonic() < deadline:
                time.sleep(LOOK)

    def _retry_produced_at(self, live: pair.LivePair) -> float | None:
        progress = live.watch.progress.get(lab.MAIN_SCRIPT)
        requests = progress.link.relay.requests() if progress is not None else []
        found = [r.at for r in requests if any(b.topic == lab.RETRY_TOPIC and b.records for b in r.produced)]
        return found[0] if found else None

    def _spun(self) -> bool:
        """retry_consumer.py has had SPIN_CPU seconds of CPU since the target's retry record was produced, and
        spins (waiting.spins): enough to judge its wait, which will not end soon. A consumer that pauses and
        polls toward the due time may use as much CPU, for ten minutes of the clock, and is waited for."""
        since, samples = self.facts["retry_produced_at"], self.samples.get(lab.RETRY_SCRIPT, [])
        if since is None or not samples:
            return False
        before = [s for s in samples if s.at <= since][-1:] or samples[:1]
        cpu, virtual = samples[-1].cpu - before[0].cpu, samples[-1].virtual - before[0].virtual
        return cpu >= SPIN_CPU and waiting.spins(cpu, virtual)

    def _batch_handled(self, live: pair.LivePair) -> bool:
        if any(self.notifier.calls[c["orderId"]] < 1 for c in self.batch2):
            return False
        committed = live.watch.committed()
        ends = pair.ends_of([pair.Placed({}, p, o) for p, o in self.landed.values()])
        return all(committed.get((lab.MAIN_GROUP, t, p), -1) >= end for (t, p), end in ends.items())

    def _expected(self) -> dict[str, int]:
        hung = [order for order, _ in self.notifier.hung]
        return {c["orderId"]: lab.EXPECTED_CALLS[c["merchant"]] + hung.count(c["orderId"])
                for c in self.batch1 + self.batch2}

    def second_half(self) -> Half:
        """Both consumers again, on the same broker and the same clock, until every attempt is made."""
        expected = self._expected()
        with self._live() as live:
            fetching = live.wait_fetching()
            done = lambda watch: all(self.notifier.calls[o] >= n for o, n in expected.items())   # noqa: E731
            stop = live.settle(done, cap=lambda watch: None)
            self.facts["cut"] = self.facts["cut"] or live.cut
            runs = dict(zip(live.scripts, live.stop_and_collect(stop)))
        return Half(runs, {}, fetching)


@RUNS.observer("durable_run")
def observe_durable(learner, kafka_backend, cancelled=None) -> DurableRun:
    with kafka_backend.private() as endpoint:
        endpoint = dataclasses.replace(endpoint, learner_session_timeout_ms=SESSION_MS,
                                       learner_auto_commit_ms=AUTO_COMMIT_MS)
        pair.create_topics(endpoint)
        scenario = _Scenario(learner, endpoint, cancelled or threading.Event())
        first = scenario.first_half()
        killed = scenario.facts["killed_at"] is not None
        second = scenario.second_half() if killed and not scenario.cancelled.is_set() else None
        state = read_state(endpoint) if not first.runs[lab.MAIN_SCRIPT].missing else None
    halves = [h for h in (first, second) if h is not None]
    calls = sorted((c for h in halves for r in h.runs.values() for c in r.calls), key=lambda c: c.t)
    return DurableRun(published=tuple(scenario.batch1 + scenario.batch2), target=scenario.target["orderId"],
                      burst=tuple(scenario.burst), landed=dict(scenario.landed), first=first, second=second,
                      hung=tuple(scenario.notifier.hung), state=state, calls=tuple(calls), **scenario.facts)


@pytest.fixture(scope="session")
def durable_run(request, learner, kafka_backend):
    return RUNS.record(request, "durable_run", learner, kafka_backend)
