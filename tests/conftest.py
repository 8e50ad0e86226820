"""Shared fixtures for the harness's own tests."""
from __future__ import annotations

import pytest

from retrylab.backends import RedisServerProcess


@pytest.fixture(scope="session")
def private_redis_server():
    """A private redis-server on a free port for tests that need real Redis (never the shared :6379)."""
    with RedisServerProcess() as server:
        yield server
