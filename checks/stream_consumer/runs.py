"""stream-consumer's learner runs, started together when the grading begins (retrylab.early): each run module
registers its maker with `@RUNS.observer("<fixture>")` and its fixture returns `RUNS.record(...)`. Each run
is on its own private Redis, on real time (RunClock.real: min-idle waits are the server's)."""
from __future__ import annotations

import pytest

from retrylab.early import EarlyRuns

RUNS = EarlyRuns("stream-consumer")


@pytest.fixture(scope="session", autouse=True)
def _start_runs(request, learner, redis_backend):
    RUNS.start_all(request, learner, redis_backend)
