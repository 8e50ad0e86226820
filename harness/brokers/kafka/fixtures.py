"""The kafka broker's pytest fixtures (an exercise on Kafka loads this module through `pytest_plugins`)."""
from __future__ import annotations

import pytest

from retrylab.plugin import grading_backend


@pytest.fixture(scope="session")
def kafka_backend(pytestconfig):
    """The grading's backend (--backend; the plugin makes it the broker's default, tansu, when none is
    named): `kafka_backend.private()` gives a check a private, empty Kafka broker of its own. One that cannot
    run here (the pinned Tansu missing, or another version) ends the grading with exit status 2 and one line."""
    yield from grading_backend(pytestconfig, "kafka", pytestconfig.getoption("--backend"))
