"""Shared fixtures for the harness's own tests."""
from __future__ import annotations

import os

import pytest

# The CLI picks its language from the locale; the tests read English messages whatever the machine's is.
os.environ["LANGUAGE"] = "en"

from retrylab.backends import RedisServerProcess


@pytest.fixture(scope="session")
def private_redis_server():
    """A private redis-server on a free port for tests that need real Redis (never the shared :6379)."""
    with RedisServerProcess() as server:
        yield server
