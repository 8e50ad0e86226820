"""retry-topics' learner runs, started together when the grading begins (retrylab.early): each run module
registers its maker with `@RUNS.observer("<fixture>")` and its fixture returns `RUNS.record(...)`."""
from __future__ import annotations

import pytest

from retrylab.early import EarlyRuns

RUNS = EarlyRuns("retry-topics")


@pytest.fixture(scope="session", autouse=True)
def _start_runs(request, learner, kafka_backend):
    RUNS.start_all(request, learner, kafka_backend)
