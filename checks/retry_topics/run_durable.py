"""Step 7's run (and the advanced checks bounded-concurrency and quiet-wait, which watch its first half):
both consumers killed with SIGKILL in the middle of a retry, then started again.

On a private broker of its own, with one virtual clock shared by consumer.py and retry_consumer.py (a
nextRetryTime one writes is due on the other's clock) and a session timeout of SESSION_MS (a killed member
holds its partitions until its session ends: about 2 s at 2000 ms, 12 s at the usual 6000):

1. Once both groups read their partitions, the harness produces `ok`, the target (merchant `down`), `ok`.
   The target fails at once; its first retry (the 2nd call) hangs: the retry consumer blocks there, in real
   time, and cannot take anything else. Meanwhile retry_consumer.py's CPU is sampled while the target's
   retry is pending and not due (quiet-wait).
2. Then a second batch: `ok`s, `flaky-1`, `flaky-2`, `down` and a burst of BURST more `down`s, whose first
   retries would hang too. consumer.py handles them all (notify, retry records, commits) while their retries
   pend on callbacks.retry, behind the hung one. The threads of both scripts are sampled (bounded-concurrency).
   retry_consumer.py has committed nothing yet: a group without a commit that starts at `latest` after the
   restart skips every one of those retries.
3. Once the main group has committed the ends of its partitions, both consumers are killed at once
   (SIGKILL), the hang is disarmed, and both start again on the same broker and the same clock (which never
   goes back: the restarted processes take it where the killed ones left it). The run ends once every
   callback has had all its attempts and held still for a moment, or nothing more happens for QUIET s.

What a kill can lose or repeat is then in the call log (both halves share one NotifierApp, so the calls of
an order are counted across the restart) and in the topics.
"""
from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass

import pytest

from retrylab.appchannel import RunClock
from retrylab.background import Beside
from retrylab.brokers.kafka.state import KafkaState, read_state
from retrylab.checks.retry_topics import lab
from retrylab.checks.retry_topics.hangs import HangingRetries
from retrylab.checks.retry_topics.runs import RUNS
from retrylab.checks.retry_topics.watch import RunWatch, Sample
from retrylab.fixtures.retry_topics.notifier_app import NotifierApp
from retrylab.runner import ScriptRun

SESSION_MS = 2000       # measured: a restart then takes 2-3.5 s on a loaded machine (1500: the same; 3000: 4 s)
BURST = 12              # failing callbacks at once in the second batch (bounded-concurrency)
RUN_TIMEOUT = 60.0      # real seconds: the outer bound of each learner run
STABLE_WAIT = 30.0      # real seconds for both groups to read their partitions (interpreters start slowly on a busy machine)
HANG_WAIT = 5.0         # real seconds after the target's first failure for its retry to come (and hang)
SPIN_CPU = 0.5          # CPU seconds of retry_consumer.py with the target's retry pending: enough to judge its wait
BATCH_WAIT = 6.0        # real seconds for consumer.py to handle and commit the second batch
SETTLE = 0.3            # real seconds left, once it has, for a thread started per failure to reach its retry
DONE_HOLD = 0.6         # real seconds every attempt must stay as it is before the restarted run ends
QUIET = 2.5             # real seconds without a call, both restarted consumers reading, before it ends anyway
LOOK = 0.02


def callback(merchant: str) -> dict:
    return {"orderId": f"ord-{uuid.uuid4().hex[:12]}", "merchant": merchant,
            "amount": random.randint(100, 99_999) / 100, "event": "paid"}


@dataclass(frozen=True)
class Half:
    """One pair of runs: consumer.py and retry_consumer.py side by side, with what was sampled of them."""
    runs: dict[str, ScriptRun]
    samples: dict[str, tuple[Sample, ...]]
    produced: dict[str, tuple]          # script -> its Produce requests (relay records)
    committed: dict[str, dict]          # script -> (group, topic, partition) -> offset, as its requests said


@dataclass(frozen=True)
class DurableRun:
    published: tuple[dict, ...]
    target: str                         # the order whose first retry hung
    burst: tuple[str, ...]              # the second batch's orders whose first retry would hang too
    second_batch: tuple[str, ...]
    landed: dict[str, tuple[int, int]]  # order id -> (partition, offset) on callbacks
    first: Half                         # until the kill (or until the harness gave up waiting for the hang)
    second: Half | None                 # None: nothing was killed, so nothing restarted
    killed_at: float | None             # real epoch seconds of the kill
    kill_virtual: float | None          # the shared clock then
    hung: tuple[tuple[str, int], ...]   # (order, call number) of the calls that hung
    retry_produced_at: float | None     # real epoch seconds consumer.py produced the target's retry record
    batch_at: float | None              # real epoch seconds the second batch was produced
    batch_handled: bool                 # the main group committed the second batch before the kill
    state: KafkaState | None            # the topics and commits at the end
    calls: tuple                        # every call of both halves, in the order of their virtual time

    def merchant(self, order: str) -> str:
        return next(c["merchant"] for c in self.published if c["orderId"] == order)

    @property
    def missing(self) -> str | None:
        return next((s for s, r in self.first.runs.items() if r.missing), None)


def _produce(endpoint, batch: list[dict]) -> dict[str, tuple[int, int]]:
    landed = endpoint.produce(lab.TOPIC, [(c["orderId"].encode(), json.dumps(c).encode()) for c in batch])
    return {c["orderId"]: where for c, where in zip(batch, landed)}


def _until(predicate, seconds: float, cancelled: threading.Event, alive) -> bool:
    """Wait until `predicate()`, at most `seconds`; False on time, cancelled, or a run that ended."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not cancelled.is_set() and alive():
        if predicate():
            return True
        time.sleep(LOOK)
    return predicate()


class _Pair:
    """consumer.py and retry_consumer.py, each run in a thread of its own, on one app and one clock."""

    def __init__(self, learner, endpoint, app, clock, watch: RunWatch):
        self.ended: set[str] = set()
        self.runs = {script: Beside(lambda _cancelled, script=script: self._run(learner, script, endpoint, app, clock,
                                                                                watch),
                                    f"retrylab-retry-topics-durable-{script}")
                     for script in (lab.MAIN_SCRIPT, lab.RETRY_SCRIPT)}

    def _run(self, learner, script, endpoint, app, clock, watch) -> ScriptRun:
        try:
            return learner.run(script, endpoint, timeout=RUN_TIMEOUT, app=app, run_clock=clock,
                               stop_when=watch.stop_condition(script))
        finally:
            self.ended.add(script)

    def all_alive(self) -> bool:
        return not self.ended

    def any_alive(self) -> bool:
        return len(self.ended) < len(self.runs)


def _finish(pair: _Pair, watch: RunWatch) -> Half:
    runs = {script: beside.result() for script, beside in pair.runs.items()}
    return Half(runs=runs, samples={s: tuple(watch.samples(s)) for s in runs},
                produced={s: tuple(watch.produced_requests(s)) for s in runs},
                committed={s: watch.committed(s) for s in runs})


class _Scenario:
    """The harness's side of the run, step by step (see the module's docstring)."""

    def __init__(self, learner, endpoint, cancelled: threading.Event):
        self.learner, self.endpoint, self.cancelled = learner, endpoint, cancelled
        ok = [callback(lab.OK) for _ in range(5)]
        self.target = callback(lab.DOWN)
        self.batch1 = [ok[0], self.target, ok[1]]
        burst = [callback(lab.DOWN) for _ in range(BURST)]
        self.batch2 = [ok[2], callback(lab.FLAKY_1), ok[3], callback(lab.FLAKY_2), callback(lab.DOWN), ok[4]] + burst
        self.burst = [c["orderId"] for c in burst]
        self.notifier = NotifierApp(self.batch1 + self.batch2)
        self.app = HangingRetries(self.notifier)
        self.app.target(self.target["orderId"], *self.burst)
        self.clock = RunClock.for_learner_run()
        self.landed: dict[str, tuple[int, int]] = {}

    def calls(self, order: str) -> int:
        return self.notifier.calls[order]

    def run(self) -> DurableRun:
        watch = RunWatch(self.clock, self.cancelled)
        pair = _Pair(self.learner, self.endpoint, self.app, self.clock, watch)
        alive = pair.all_alive
        record = dict(first=None, second=None, killed_at=None, kill_virtual=None, retry_produced_at=None,
                      batch_at=None, batch_handled=False)
        stable = _until(lambda: all(watch.fetching(s) for s in pair.runs), STABLE_WAIT, self.cancelled, alive)
        if stable:
            self.landed.update(_produce(self.endpoint, self.batch1))
            _until(lambda: self.notifier.hung or self._retry_produced_at(watch) is not None, HANG_WAIT,
                   self.cancelled, alive)
            record["retry_produced_at"] = self._retry_produced_at(watch)
            _until(lambda: self.notifier.hung or self._spun(watch, record["retry_produced_at"]),
                   HANG_WAIT, self.cancelled, alive)
            record["batch_at"] = time.time()
            self.landed.update(_produce(self.endpoint, self.batch2))
            record["batch_handled"] = _until(lambda: self._batch_handled(watch), BATCH_WAIT, self.cancelled, alive)
            time.sleep(SETTLE)
        if stable and self.notifier.hung and alive():
            record["killed_at"], record["kill_virtual"] = time.time(), self.clock.now()
            watch.kill()
        else:
            watch.end()
        self.app.disarm()
        record["first"] = _finish(pair, watch)
        if record["killed_at"] is not None and not self.cancelled.is_set():
            record["second"] = self._restart()
        return record

    def _retry_produced_at(self, watch: RunWatch) -> float | None:
        found = [r.at for r in watch.produced_requests(lab.MAIN_SCRIPT)
                 if any(b.topic == lab.RETRY_TOPIC and b.records for b in r.produced)]
        return found[0] if found else None

    def _spun(self, watch: RunWatch, since: float | None) -> bool:
        """retry_consumer.py has had SPIN_CPU seconds of CPU since the target's retry record was produced."""
        samples = watch.samples(lab.RETRY_SCRIPT)
        if since is None or not samples:
            return False
        before = [s.cpu for s in samples if s.at <= since]
        return samples[-1].cpu - (before[-1] if before else 0.0) >= SPIN_CPU

    def _batch_handled(self, watch: RunWatch) -> bool:
        if any(self.calls(c["orderId"]) < 1 for c in self.batch2):
            return False
        ends: dict[int, int] = {}
        for partition, offset in self.landed.values():
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        committed = watch.committed(lab.MAIN_SCRIPT)
        # the partition of the hung target's record counts too: consumer.py handed it on before the retry hung
        return all(committed.get((lab.MAIN_GROUP, lab.TOPIC, p), -1) >= end for p, end in ends.items())

    def _expected(self) -> dict[str, int]:
        hung = {order for order, _ in self.notifier.hung}
        return {c["orderId"]: lab.EXPECTED_CALLS[c["merchant"]] + (c["orderId"] in hung)
                for c in self.batch1 + self.batch2}

    def _restart(self) -> Half:
        watch = RunWatch(self.clock, self.cancelled)
        pair = _Pair(self.learner, self.endpoint, self.app, self.clock, watch)
        expected = self._expected()
        last = [None, time.monotonic()]     # the calls seen, and when they last changed

        def settled() -> bool:
            if not all(watch.fetching(s) for s in pair.runs):
                return False
            counts = tuple(self.calls(o) for o in expected)
            if counts != last[0]:
                last[0], last[1] = counts, time.monotonic()
            quiet_for = time.monotonic() - last[1]
            done = all(self.calls(o) >= n for o, n in expected.items())
            return quiet_for >= (DONE_HOLD if done else QUIET)

        _until(settled, RUN_TIMEOUT - 5, self.cancelled, pair.any_alive)
        watch.end()
        return _finish(pair, watch)


@RUNS.observer("durable_run")
def observe_durable(learner, kafka_backend, cancelled=None) -> DurableRun:
    cancelled = cancelled or threading.Event()
    with kafka_backend.private() as endpoint:
        endpoint = dataclasses.replace(endpoint, learner_session_timeout_ms=SESSION_MS)
        endpoint.create_topics(lab.PARTITIONS)
        scenario = _Scenario(learner, endpoint, cancelled)
        record = scenario.run()
        state = read_state(endpoint)
    halves = [h for h in (record["first"], record["second"]) if h is not None]
    calls = sorted((c for h in halves for r in h.runs.values() for c in r.calls), key=lambda c: c.t)
    return DurableRun(published=tuple(scenario.batch1 + scenario.batch2), target=scenario.target["orderId"],
                      burst=tuple(scenario.burst), second_batch=tuple(c["orderId"] for c in scenario.batch2),
                      landed=dict(scenario.landed), first=record["first"], second=record["second"],
                      killed_at=record["killed_at"], kill_virtual=record["kill_virtual"],
                      hung=tuple(scenario.notifier.hung), retry_produced_at=record["retry_produced_at"],
                      batch_at=record["batch_at"],
                      batch_handled=record["batch_handled"], state=state, calls=tuple(calls))


@pytest.fixture(scope="session")
def durable_run(request, learner, kafka_backend):
    return RUNS.record(request, "durable_run", learner, kafka_backend)
