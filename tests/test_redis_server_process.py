"""The private redis-server the `redis-server` backend (and these tests) start."""
from __future__ import annotations

import itertools
import socket

import pytest

from retrylab import backends
from retrylab.backends import RedisServerProcess
from retrylab.proxy import RecordingProxy


def test_a_port_taken_after_probing_is_not_mistaken_for_our_server(monkeypatch, private_redis_server):
    """Parallel graders can be handed the same free port: the loser must not adopt the winner's server."""
    with RecordingProxy((private_redis_server.host, private_redis_server.port)) as stranger:
        taken = [stranger.address[1], private_redis_server.port]  # a proxy and a real redis-server answer PING
        real_free_port = backends.free_port
        ports = itertools.chain(taken, iter(real_free_port, None))
        monkeypatch.setattr(backends, "free_port", lambda: next(ports))
        process = RedisServerProcess()
        with process as endpoint:
            assert endpoint.port not in taken
            with endpoint.client() as client:
                assert client.info("server")["process_id"] == process._proc.pid


def test_private_redis_in_use_at_once_are_separate_servers_and_reused_after():
    backend = backends.RedisServerBackend()
    backend.start()
    try:
        with backend.private() as first, first.client() as a:
            a.set("mine", "first")
            with backend.private() as second, second.client() as b:
                assert second.port != first.port
                assert b.dbsize() == 0             # the other check's key is not here...
                b.set("mine", "second")
            assert a.get("mine") == b"first"      # ...and emptying this one did not touch it
        with backend.private() as again, again.client() as c:
            assert again.port in (first.port, second.port)   # no third server for checks one after another
            assert c.dbsize() == 0
        assert len(backend._servers) == 2
    finally:
        backend.stop()
    for endpoint in (first, second):   # both processes are gone
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((endpoint.host, endpoint.port), timeout=5).close()
