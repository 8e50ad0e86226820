"""The redis broker's pytest fixtures (an exercise on Redis loads this module through `pytest_plugins`)."""
from __future__ import annotations

import pytest

from retrylab.brokers import BackendUnavailable
from retrylab.brokers.redis import REDIS_URL, make_backend
from retrylab.plugin import cannot_grade


@pytest.fixture(scope="session")
def redis_backend(pytestconfig):
    """The grading's backend (--backend, which the plugin makes the broker's default when none is named;
    --redis-url): `redis_backend.private()` gives a check its private Redis. One that cannot work here
    ends the grading with exit status 2 and one line."""
    try:
        backend = make_backend(pytestconfig.getoption("--backend"),
                               redis_url=pytestconfig.getoption(REDIS_URL.pytest_dest or REDIS_URL.dest))
        backend.start()
    except BackendUnavailable as exc:
        cannot_grade(pytestconfig, str(exc))
    yield backend
    backend.stop()
