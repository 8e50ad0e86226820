"""What several steps of backoff-dlq observe: one run of the learner's worker.

Steps 1, 2, 6 and 7 all look at the same run (six good messages, one bad one in the middle): it is
run once per grading, on its own private Redis, and what it did is kept as an immutable record
that each check reads. That keeps grading fast without the checks sharing any mutable state.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from retrylab import keyspace
from retrylab.fixtures import messages
from retrylab.fixtures.taskproc_app import TaskprocApp
from retrylab.runner import Progress, ScriptRun

from retrylab.checks.backoff_dlq import advanced
from retrylab.checks.backoff_dlq.advanced import advanced_run  # noqa: F401 - a session fixture: the advanced checks' shared run

RUN_TIMEOUT = 15.0          # seconds of real time a worker run may take
QUIET = 0.3                 # done and nothing changed for this long: the worker has settled
LONG_QUIET = 2.5            # not done, but nothing changed for this long: it will not get there
RETRIES_FOREVER = 25        # calls of process for one message that mean "never gives up"


@dataclass(frozen=True)
class WorkerRun:
    seeded: tuple[dict, ...]
    bad: dict
    run: ScriptRun
    seeded_at: float
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


def _settled(batch: list[dict]):
    goods = [m["id"] for m in batch if m["kind"] == "good"]
    bad = next(m["id"] for m in batch if m["kind"] == "bad")

    def stop(progress: Progress) -> bool:
        calls = progress.calls()
        counts = Counter(c.id for c in calls)
        if counts and max(counts.values()) > RETRIES_FOREVER:
            return True
        quiet = progress.quiet_for()
        if quiet >= LONG_QUIET:
            return True
        if quiet < QUIET:
            return False
        done = {c.id for c in calls if c.outcome == "ok"}
        content = progress.keyspace()
        dlq = content.get(messages.DLQ.encode())
        return (all(g in done for g in goods) and messages.QUEUE.encode() not in content
                and dlq is not None and any(bad.encode() in v for v in dlq.values))

    return stop


@pytest.fixture(scope="session")
def worker_run(request, learner, redis_backend) -> WorkerRun:
    advanced.start_early(request, learner, redis_backend)   # the advanced checks' own worker run, meanwhile
    batch = messages.worker_batch()
    bad = next(m for m in batch if m["kind"] == "bad")
    with redis_backend.private() as endpoint, endpoint.client() as client:
        client.rpush(messages.QUEUE, *(json.dumps(m) for m in batch))
        seeded_at = time.time()
        run = learner.run("worker.py", endpoint, timeout=RUN_TIMEOUT, stop_when=_settled(batch),
                          app=TaskprocApp(seeded=batch))     # process decides by what was seeded
        content = keyspace.dump(client)
    return WorkerRun(seeded=tuple(batch), bad=bad, run=run, seeded_at=seeded_at,
                     queue=content.get(messages.QUEUE.encode()), dlq=content.get(messages.DLQ.encode()),
                     keys=content)
