"""The private redis-server the `redis-server` backend (and these tests) start."""
from __future__ import annotations

import itertools

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
