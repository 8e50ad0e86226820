"""Step 5's run: consumer.py and lag.py side by side on one private Redis (group `workers` made at id 0),
while the harness adds a burst of orders faster than the consumer drains them and samples the group's lag
itself.

- consumer.py runs in the main thread (the step's clock bounds it); each effect takes EFFECT_PAUSE of real
  time, so a burst of BURST_SIZE orders over BURST_SECONDS outruns it.
- lag.py runs beside it (its own timeout), from the start; it is stopped when the consumer's run ends.
- The burst starts at a random moment, BURST_DELAY after lag.py's first broker command (or LAG_READY_WAIT
  after lag.py's start if it sends none): a series printed without looking cannot know when.
- The harness samples undelivered + pending (streams.group) and XLEN every SAMPLE_EVERY s, stamped with
  time.time(), from before lag.py starts to after it stops.
- The consumer's run ends once the burst is all added and the group has nothing left (pending 0, nothing
  after last-delivered-id) for AFTER_DRAINED, so lag.py has printed its way back to 0; or when the
  consumer is stuck (see settling), or past RUN_TIMEOUT once the group's backlog stops falling (a busy machine
  slows the drain: settling.slowed_down), or at its timeout. The burst counts as drained (`drained_at`) at the
  first sample with pending 0 and last-delivered-id = the burst's last id (XINFO's `lag` is never
  trusted: LAB.md, measured facts).

The reference's run takes about 3 s (0.4 s to start, 0.3-0.8 s before the burst, 0.4 s of burst, 0.5-0.9 s
of drain, 1 s after).
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

import pytest

from retrylab.appchannel import RunClock
from retrylab.background import Beside, without_step_clock
from retrylab.checks.stream_consumer import streams
from retrylab.checks.stream_consumer.runs import RUNS
from retrylab.checks.stream_consumer.lag_compare import HarnessSample, RunWindow
from retrylab.checks.stream_consumer.settling import BUSY_FACTOR, RUN_TIMEOUT, STUCK_CPU, held_for, slowed_down
from retrylab.fixtures.stream_consumer import orders
from retrylab.fixtures.stream_consumer.effects_app import EffectsApp
from retrylab.runner import ScriptRun
from retrylab.settle import Reason, blocked, no_progress, when

BURST_SIZE = (55, 75)       # orders, drawn at random for each grading: a peak of ~30-50, 0.5-0.9 s to drain
BURST_SECONDS = 0.4         # the burst is added over this long, in BURST_CHUNKS even pieces
BURST_CHUNKS = 16
BURST_DELAY = (0.2, 0.5)    # seconds after lag.py's first broker command, drawn at random
LAG_READY_WAIT = 1.5        # seconds after lag.py's start: the burst starts then if lag.py sent nothing
EFFECT_PAUSE = 0.012        # seconds each effect takes: the reference then drains ~60 orders a second
SAMPLE_EVERY = 0.05         # seconds between two harness samples of the lag
MAX_SAMPLES = 1000          # bound of the sample list (50 s of samples: more than any run)
AFTER_DRAINED = 0.8         # seconds the run goes on once the burst is drained: lag.py's lines back at 0 (period 0.5 s)
CONSUMER_TIMEOUT = RUN_TIMEOUT * BUSY_FACTOR   # past RUN_TIMEOUT only while the burst still drains (slowed_down)
LAG_RUN_TIMEOUT = CONSUMER_TIMEOUT + 3.0      # lag.py's own bound; it is normally stopped with the consumer


@dataclass(frozen=True)
class LagRun:
    consumer: ScriptRun
    lag: ScriptRun
    window: RunWindow | None            # when lag.py ran (None: it is missing)
    harness: tuple[HarnessSample, ...]
    burst: tuple[dict, ...]
    burst_started: float | None         # time.time() of its first XADD; None: it never started
    burst_added: float | None           # time.time() after its last XADD
    drained_at: float | None            # the first harness sample with the whole burst drained
    end_state: streams.GroupState | None


class _Burst:
    """The burst's orders and what became of them (written by the burst's thread, read by the others)."""

    def __init__(self):
        self.orders = orders.batch(*["ok"] * random.randint(*BURST_SIZE))
        self.ids: list[bytes] = []
        self.started: float | None = None
        self.added: float | None = None

    def add(self, client, lag_ready: threading.Event, lag_began: threading.Event, cancelled) -> None:
        lag_began.wait()
        lag_ready.wait(LAG_READY_WAIT)
        if cancelled.wait(random.uniform(*BURST_DELAY)):
            return
        size = len(self.orders)
        chunks = [self.orders[i * size // BURST_CHUNKS:(i + 1) * size // BURST_CHUNKS] for i in range(BURST_CHUNKS)]
        start = time.monotonic()
        self.started = time.time()
        for i, chunk in enumerate(chunks):
            if cancelled.wait(max(0.0, start + i * BURST_SECONDS / BURST_CHUNKS - time.monotonic())):
                return
            self.ids += streams.seed(client, chunk) if chunk else []
        self.added = time.time()


def _sample(client, cancelled) -> list[tuple[HarnessSample, bytes]]:
    """(sample, last-delivered-id) every SAMPLE_EVERY s until cancelled."""
    found = []
    next_at = time.monotonic()
    while not cancelled.is_set() and len(found) < MAX_SAMPLES:
        before = time.time()
        state = streams.group(client)
        length = streams.length(client)
        after = time.time()
        if state is not None and length is not None:   # a learner script may delete the group: no sample then
            found.append((HarnessSample(at=(before + after) / 2, lag=state.lag, pending=state.pending,
                                        xlen=int(length)), state.last_delivered))
        next_at += SAMPLE_EVERY
        cancelled.wait(max(0.0, next_at - time.monotonic()))
    return found


def _run_lag(learner, endpoint, lag_ready: threading.Event, lag_began: threading.Event, cancelled):
    def ready_or_stopped(progress) -> bool:
        if progress.started():
            lag_ready.set()
        return cancelled.is_set()

    began = time.time()
    lag_began.set()
    try:
        run = without_step_clock(learner).run("lag.py", endpoint, timeout=LAG_RUN_TIMEOUT,
                                              stop_when=when(ready_or_stopped, Reason.CANCELLED),
                                              run_clock=RunClock.real())
    finally:
        lag_ready.set()     # a burst still waiting goes ahead (or sees it is cancelled)
    ended = time.time()
    if run.missing:
        return run, None
    timing = run.timing
    window = RunWindow(started=began + timing.prepare, ended=ended - timing.cleanup,
                       first_command=run.commands[0].at if run.commands else None)
    return run, window


def _nothing_left(burst: _Burst):
    """Whether the whole burst was added and the group has nothing left to deliver or to acknowledge.
    Normally that is the burst drained; it also ends a run whose entries someone deleted (which then
    never reach last-delivered-id = the burst's last id: LagRun.drained_at stays None)."""
    def done(progress) -> bool:
        if burst.added is None:
            return False
        state = streams.group(progress.link.client)
        return state is not None and state.pending == 0 and state.undelivered == 0

    return done


def _backlog(progress) -> int | None:
    """The group's entries left to deliver or to acknowledge (None: there is no group)."""
    state = streams.group(progress.link.client)
    return state.lag if state is not None else None


@RUNS.observer("lag_run")
def observe_lag(learner, redis_backend, cancelled: threading.Event | None = None) -> LagRun:
    cancelled = cancelled or threading.Event()
    burst = _Burst()
    lag_ready, lag_began = threading.Event(), threading.Event()
    with redis_backend.private() as endpoint, endpoint.client() as client, \
            endpoint.client() as burst_client, endpoint.client() as sample_client:
        streams.create_group(client)
        with Beside(lambda stop: _sample(sample_client, stop), "retrylab-lag-samples") as sampler, \
                Beside(lambda stop: _run_lag(learner, endpoint, lag_ready, lag_began, stop), "retrylab-lag-py") as lag, \
                Beside(lambda stop: burst.add(burst_client, lag_ready, lag_began, stop), "retrylab-burst") as adder:
            drained_long_enough = held_for(_nothing_left(burst), AFTER_DRAINED)

            def finished(progress) -> bool:   # lag.py is stopped at the same moment as the consumer
                if drained_long_enough(progress):
                    lag.cancelled.set()
                    return True
                return False

            stop_when = (when(lambda progress: cancelled.is_set(), Reason.CANCELLED)
                         | when(finished, Reason.DONE_WAITED, lambda progress: f"{AFTER_DRAINED:.1f}")
                         # a consumer waiting in XREADGROUP BLOCK 0 is fine until the burst is all there
                         | (when(lambda progress: burst.added is not None, Reason.BLOCKED_FOREVER)
                            & blocked(forever=True))
                         | no_progress(cpu=STUCK_CPU)
                         | slowed_down(_backlog))
            consumer = learner.run("consumer.py", endpoint, timeout=CONSUMER_TIMEOUT, stop_when=stop_when,
                                   app=EffectsApp(seeded=burst.orders, pause=EFFECT_PAUSE), run_clock=RunClock.real())
            lag_run, window = lag.stop()
            adder.stop()
            sampled = sampler.stop()
        end_state = streams.group(client)
    last_id = burst.ids[-1] if burst.added is not None and burst.ids else None
    drained_at = next((s.at for s, last in sampled
                       if last_id is not None and s.at >= burst.added and s.pending == 0 and last == last_id), None)
    return LagRun(consumer=consumer, lag=lag_run, window=window, harness=tuple(s for s, _ in sampled),
                  burst=tuple(burst.orders), burst_started=burst.started, burst_added=burst.added,
                  drained_at=drained_at, end_state=end_state)


@pytest.fixture(scope="session")
def lag_run(request, learner, redis_backend) -> LagRun:
    return RUNS.record(request, "lag_run", learner, redis_backend)
