"""Shared fixtures for the harness's own tests."""
from __future__ import annotations

import os

import pytest

# The CLI picks its language from the locale; the tests read English messages whatever the machine's is.
os.environ["LANGUAGE"] = "en"

from retrylab.brokers.redis.endpoint import Endpoint
from retrylab.brokers.redis.server_process import RedisServerProcess
from retrylab.brokers.redis.fakeredis_fixes import start_fake_server, stop_fake_server

from gradings import Gradings, shared_folder


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


@pytest.fixture(scope="module")
def fake_endpoint():
    """A fake server (fakeredis over TCP, with the harness's fixes) shared by a module's tests."""
    server = start_fake_server()
    yield Endpoint("127.0.0.1", server.port)
    stop_fake_server(server)


@pytest.fixture(params=["fake", "real"])
def endpoint(request) -> Endpoint:
    """An empty Redis of each kind: the module's fake server, then the private redis-server."""
    chosen = request.getfixturevalue("fake_endpoint" if request.param == "fake" else "private_redis_server")
    with chosen.client() as client:
        client.flushall()
    return chosen


@pytest.fixture(scope="session")
def shared_gradings(tmp_path_factory):
    """The session's full gradings of corpus entries and reference solutions, each made once (in whichever
    xdist worker asks first) and read by every test that asserts something of it (tests/gradings.py)."""
    return Gradings(shared_folder(tmp_path_factory.getbasetemp()))
