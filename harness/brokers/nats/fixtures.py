"""The nats broker's pytest fixtures (an exercise on NATS loads this module through `pytest_plugins`)."""
from __future__ import annotations

import pytest

from retrylab.brokers import BackendUnavailable
from retrylab.brokers.nats import make_backend
from retrylab.plugin import cannot_grade


@pytest.fixture(scope="session")
def nats_backend(pytestconfig):
    """The grading's backend (--backend, which the plugin makes the broker's default when none is named):
    `nats_backend.private()` gives a check its private, empty nats-server. One that cannot work here (the
    pinned nats-server missing, another version) ends the grading with exit status 2 and one line."""
    try:
        backend = make_backend(pytestconfig.getoption("--backend") or "nats-server")
        backend.start()
    except BackendUnavailable as exc:
        cannot_grade(pytestconfig, str(exc))
    yield backend
    backend.stop()
