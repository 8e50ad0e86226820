"""The learner runs backoff-dlq's checks read, made once per grading (session fixtures, loaded by
conftest.py through `pytest_plugins`), each on its own private broker, and kept as immutable records.

`worker_run`: steps 1, 2, 6 and 7 all look at the same run (six good messages, one bad one in the
middle), so grading stays fast without the checks sharing any mutable state.

`advanced_run`, for the advanced checks (beyond the lab's text: seed 000's "what to retry" list and
its two classic mistakes; reported apart, they never change the lab's result): ONE extra run of the learner's worker on
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
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass

import pytest

from retrylab.appchannel import RunClock
from retrylab.background import Beside, without_step_clock
from retrylab.brokers.redis import keyspace
from retrylab.calllog import Call
from retrylab.checks.backoff_dlq import lab
from retrylab.checks.backoff_dlq.advanced import FLAKY, ordered
from retrylab.checks.backoff_dlq.settling import (ONE_SHOT, RUN_TIMEOUT, every_message_accounted, lab_done,
                                                  worker_settled)
from retrylab.fixtures.backoff_dlq import message_factory
from retrylab.fixtures.backoff_dlq.taskproc_app import TaskprocApp
from retrylab.runner import ScriptRun
from retrylab.settle import Reason, when

ALERT_DEPTH = 3         # entries in the DLQ for the second run of alert.py
ALERT_TIMEOUT = 10.0    # outer bound, real seconds, of each run of alert.py (settling.ONE_SHOT stops loops)


# --------------------------------------------------------------------------------------------
# the lab steps' worker run


@dataclass(frozen=True)
class WorkerRun:
    """What the learner's worker did with the lab's batch: the calls, the commands, Redis after it."""
    seeded: tuple[dict, ...]
    bad: dict
    run: ScriptRun
    seeded_at: float                       # on the run's clock (RunClock.now), as the calls' times are
    queue: keyspace.KeyContent | None      # q:tasks after the run
    dlq: keyspace.KeyContent | None        # q:tasks:dlq after the run
    keys: dict

    @property
    def goods(self) -> tuple[dict, ...]:
        return tuple(m for m in self.seeded if m is not self.bad)

    def calls_for(self, message: dict):
        return [c for c in self.run.calls if c.id == message["id"]]

    def call_counts(self) -> Counter:
        return Counter(c.id for c in self.run.calls)


@pytest.fixture(scope="session")
def worker_run(request, learner, redis_backend) -> WorkerRun:
    start_early(request, learner, redis_backend)   # the advanced checks' own worker run, meanwhile
    batch = message_factory.worker_batch()
    bad = next(m for m in batch if m["kind"] == "bad")
    with redis_backend.private() as endpoint, endpoint.client() as client:
        client.rpush(lab.QUEUE, *(json.dumps(m) for m in batch))
        clock = RunClock.for_learner_run()   # days ahead of real time: seeded_at is on the run's clock
        seeded_at = clock.now()
        run = learner.run("worker.py", endpoint, timeout=RUN_TIMEOUT,
                          stop_when=worker_settled(lab_done(batch)),
                          app=TaskprocApp(seeded=batch), run_clock=clock)   # process decides by what was seeded
        content = keyspace.dump(client)
    return WorkerRun(seeded=tuple(batch), bad=bad, run=run, seeded_at=seeded_at,
                     queue=content.get(lab.QUEUE.encode()), dlq=content.get(lab.DLQ.encode()),
                     keys=content)


# --------------------------------------------------------------------------------------------
# the advanced checks' run


def advanced_batch() -> list[dict]:
    """One message of each kind plus four good ones, goods at both ends and in the middle."""
    kind = message_factory.new_message
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
        return self.keys.get(lab.DLQ.encode())

    @property
    def queue(self) -> keyspace.KeyContent | None:
        return self.keys.get(lab.QUEUE.encode())

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
            client.delete(lab.DLQ)
            if entries:
                client.rpush(lab.DLQ, *(message_factory.lab_dlq_entry(message_factory.new_message("bad"),
                                                                    error="kind=bad is rejected by taskproc")
                                             for _ in range(entries)))
            run = learner.run("alert.py", endpoint, timeout=ALERT_TIMEOUT,
                              stop_when=when(lambda progress: cancelled.is_set(), Reason.CANCELLED) | ONE_SHOT)
            left = client.llen(lab.DLQ) if client.type(lab.DLQ) == b"list" else None
            runs.append(AlertRun(entries=entries, run=run, left=left))
            if run.missing or cancelled.is_set():
                break
    return tuple(runs)


def _observe(learner, redis_backend, cancelled: threading.Event) -> AdvancedRun:
    alerts = None
    if redis_backend.independent_privates:  # else one server (or database) is emptied for each private Redis
        alerts = Beside(lambda c: run_alerts(without_step_clock(learner), redis_backend, c), "retrylab-alert-runs",
                        cancelled)
    try:
        batch = advanced_batch()
        preseeded = message_factory.new_message("bad")
        clock = RunClock.for_learner_run()   # days ahead of real time: the harness's times are on it too
        entry = message_factory.lab_dlq_entry(preseeded, first_seen_at=clock.now() - 3600,
                                       error=f"task {preseeded['id']}: kind=bad is rejected by taskproc").encode()
        with redis_backend.private() as endpoint, endpoint.client() as client:
            client.rpush(lab.DLQ, entry)
            client.rpush(lab.QUEUE, *(json.dumps(m) for m in batch))
            seeded_at = clock.now()
            run = learner.run("worker.py", endpoint, timeout=RUN_TIMEOUT,
                              stop_when=worker_settled(every_message_accounted(batch), cancelled),
                              app=TaskprocApp(seeded=[*batch, preseeded]), run_clock=clock)
            content = keyspace.dump(client)
        alert_runs = alerts.result() if alerts else run_alerts(learner, redis_backend, cancelled)
    except BaseException:
        if alerts:
            alerts.cancel()   # nothing of this run may outlive it (a step's time limit, Ctrl-C)
        raise
    return AdvancedRun(seeded=tuple(batch), preseeded=preseeded, preseeded_entry=entry, run=run,
                       keys=content, seeded_at=seeded_at, alerts=alert_runs)


_EARLY = pytest.StashKey[Beside]()


def start_early(request, learner, redis_backend) -> None:
    """Begin the advanced run now, beside the lab steps' worker run, when the grading includes advanced
    checks and the two runs can use private Redis at once: a grading then waits for one worker run
    instead of two. Called from the session fixture of that worker run; stopped when the session ends."""
    config = request.config
    if (_EARLY in config.stash or not redis_backend.independent_privates
            or not any(item.get_closest_marker("advanced") for item in request.session.items)):
        return
    early = Beside(lambda cancelled: _observe(without_step_clock(learner), redis_backend, cancelled),
                   "retrylab-advanced-run")
    config.stash[_EARLY] = early
    request.addfinalizer(early.cancel)


@pytest.fixture(scope="session")
def advanced_run(learner, redis_backend, pytestconfig) -> AdvancedRun:
    early = pytestconfig.stash.get(_EARLY, None)
    if early is not None:
        return early.result()
    return _observe(learner, redis_backend, threading.Event())
