"""What several steps of backoff-dlq observe: one run of the learner's worker.

Steps 1, 2, 6 and 7 all look at the same run (six good messages, one bad one in the middle): it is
run once per grading, on its own private Redis, and what it did is kept as an immutable record
that each check reads. That keeps grading fast without the checks sharing any mutable state.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import pytest

from retrylab.brokers.redis import keyspace
from retrylab.appchannel import RunClock
from retrylab.fixtures import messages
from retrylab.fixtures.taskproc_app import TaskprocApp
from retrylab.runner import ScriptRun

from retrylab.checks.backoff_dlq import advanced
from retrylab.checks.backoff_dlq.advanced import advanced_run  # noqa: F401 - a session fixture: the advanced checks' shared run
from retrylab.checks.backoff_dlq.settling import RUN_TIMEOUT, lab_done, worker_settled


@dataclass(frozen=True)
class WorkerRun:
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
    advanced.start_early(request, learner, redis_backend)   # the advanced checks' own worker run, meanwhile
    batch = messages.worker_batch()
    bad = next(m for m in batch if m["kind"] == "bad")
    with redis_backend.private() as endpoint, endpoint.client() as client:
        client.rpush(messages.QUEUE, *(json.dumps(m) for m in batch))
        clock = RunClock.for_learner_run()   # days ahead of real time: seeded_at is on the run's clock
        seeded_at = clock.now()
        run = learner.run("worker.py", endpoint, timeout=RUN_TIMEOUT,
                          stop_when=worker_settled(lab_done(batch)),
                          app=TaskprocApp(seeded=batch), run_clock=clock)   # process decides by what was seeded
        content = keyspace.dump(client)
    return WorkerRun(seeded=tuple(batch), bad=bad, run=run, seeded_at=seeded_at,
                     queue=content.get(messages.QUEUE.encode()), dlq=content.get(messages.DLQ.encode()),
                     keys=content)
