"""The redis broker's pytest fixtures (an exercise on Redis loads this module through `pytest_plugins`)."""
from __future__ import annotations

import pytest

from retrylab.brokers.redis import REDIS_URL
from retrylab.plugin import grading_backend


@pytest.fixture(scope="session")
def redis_backend(pytestconfig):
    """The grading's backend (--backend, which the plugin makes the broker's default when none is named;
    --redis-url): `redis_backend.private()` gives a check its private Redis. One that cannot work here
    ends the grading with exit status 2 and one line."""
    yield from grading_backend(pytestconfig, "redis", pytestconfig.getoption("--backend"),
                               redis_url=pytestconfig.getoption(REDIS_URL.pytest_dest or REDIS_URL.dest))
