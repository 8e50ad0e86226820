"""The nats broker's pytest fixtures (an exercise on NATS loads this module through `pytest_plugins`)."""
from __future__ import annotations

import pytest

from retrylab.plugin import grading_backend


@pytest.fixture(scope="session")
def nats_backend(pytestconfig):
    """The grading's backend (--backend, which the plugin makes the broker's default when none is named):
    `nats_backend.private()` gives a check its private, empty nats-server. One that cannot work here (the
    pinned nats-server missing, another version) ends the grading with exit status 2 and one line."""
    yield from grading_backend(pytestconfig, "nats", pytestconfig.getoption("--backend") or "nats-server")
