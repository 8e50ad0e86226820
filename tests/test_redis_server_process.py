"""The private redis-server the `redis-server` backend (and these tests) start."""
from __future__ import annotations

import itertools
import socket

import pytest

from helpers import alive
from retrylab.brokers.redis import server_process
from retrylab.brokers.redis.server import RedisServerBackend
from retrylab.brokers.redis.server_process import RedisServerProcess
from retrylab.brokers.redis.proxy import RecordingProxy


def test_a_port_taken_after_probing_is_not_mistaken_for_our_server(monkeypatch, private_redis_server):
    """Parallel graders can be handed the same free port: the loser must not adopt the winner's server."""
    with RecordingProxy((private_redis_server.host, private_redis_server.port)) as stranger:
        taken = [stranger.address[1], private_redis_server.port]  # a proxy and a real redis-server answer PING
        real_free_port = server_process.free_port
        ports = itertools.chain(taken, iter(real_free_port, None))
        monkeypatch.setattr(server_process, "free_port", lambda: next(ports))
        process = RedisServerProcess()
        with process as endpoint:
            assert endpoint.port not in taken
            with endpoint.client() as client:
                assert client.info("server")["process_id"] == process._proc.pid


def test_private_redis_in_use_at_once_are_separate_servers_and_reused_after():
    backend = RedisServerBackend()
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


def _lock_out(client, how: str) -> None:
    """What a learner's script reaching the server directly (no relay) could do to outlive its check."""
    if how == "requirepass":
        client.config_set("requirepass", "learner-secret")
    elif how == "acl default off":
        client.acl_setuser("default", enabled=False)
    elif how == "acl user added":
        client.acl_setuser("backdoor", enabled=True, nopass=True, commands=["+@all"], keys=["*"])
    elif how == "config changed":
        client.config_set("notify-keyspace-events", "KEA")
    elif how == "port moved":
        client.config_set("port", str(server_process.free_port()))
    elif how == "clients paused":
        client.client_pause(60_000)
    elif how == "replica of nowhere":
        client.replicaof("127.0.0.1", str(server_process.free_port()))


@pytest.mark.parametrize("how", ["requirepass", "acl default off", "acl user added", "config changed", "port moved",
                                 "clients paused", "replica of nowhere"])
def test_a_server_changed_by_an_earlier_check_is_replaced(how):
    backend = RedisServerBackend()
    backend.start()
    try:
        with backend.private() as first, first.client() as client:
            client.set("left", "behind")
            pid = backend._by_endpoint[first].pid
            _lock_out(client, how)
        with backend.private() as second, second.client() as client:   # a fresh server, no harness error
            assert client.ping()
            assert client.dbsize() == 0
            assert client.config_get("requirepass") == {"requirepass": ""}
            assert client.config_get("maxmemory") == {"maxmemory": str(256 << 20)}
            assert backend._by_endpoint[second].pid != pid
        assert len(backend._servers) == 1
        assert not alive(pid)                     # the changed one was stopped, not left running
    finally:
        backend.stop()


def test_an_unchanged_server_is_reused():
    backend = RedisServerBackend()
    backend.start()
    try:
        with backend.private() as first, first.client() as client:
            client.set("k", "v")
            client.rpush("q", "a")
            client.eval("return redis.call('INCR', 'n')", 0)
            client.client_setname("learner")
        with backend.private() as again, again.client() as client:
            assert again == first and client.dbsize() == 0
    finally:
        backend.stop()


def test_private_servers_have_a_memory_limit(private_redis_server):
    with private_redis_server.client() as client:
        assert client.config_get("maxmemory*") == {"maxmemory": str(256 << 20), "maxmemory-policy": "noeviction",
                                                   "maxmemory-samples": "5", "maxmemory-eviction-tenacity": "10",
                                                   "maxmemory-clients": "0"}


