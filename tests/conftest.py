"""Shared fixtures for the harness's own tests."""
from __future__ import annotations

import os

import pytest

# The CLI picks its language from the locale; the tests read English messages whatever the machine's is.
os.environ["LANGUAGE"] = "en"

from retrylab.backends import RedisServerProcess


@pytest.fixture(scope="session")
def _redis_server_process():
    with RedisServerProcess() as server:
        yield server


@pytest.fixture
def private_redis_server(_redis_server_process):
    """A private redis-server on a free port for tests that need real Redis (never the shared :6379),
    one process per test session, empty at the start of every test: whatever an earlier test left
    (entries in q:tasks:dlq, a client still connected, a loaded script) would otherwise be read by the
    next one, which then passes or fails by the order the tests ran in."""
    with _redis_server_process.client() as client:
        client.client_kill_filter(_type="normal", skipme=True)
        client.flushall()
        client.script_flush()
    return _redis_server_process
