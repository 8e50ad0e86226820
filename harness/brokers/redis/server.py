"""The redis-server backend: private redis-server processes (retrylab.brokers.redis.server_process)."""
from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from retrylab.brokers.redis.backend import ServerPool
from retrylab.brokers.redis.endpoint import Endpoint
from retrylab.brokers.redis.server_process import RedisServerProcess, server_state


class RedisServerBackend(ServerPool):
    """Private redis-server processes for the whole grading (see ServerPool), each emptied for every check
    that uses it, and replaced when an earlier check's script changed it beyond what emptying undoes."""

    name = "redis-server"

    def __init__(self):
        super().__init__()
        self._servers: list[RedisServerProcess] = []
        self._by_endpoint: dict[Endpoint, RedisServerProcess] = {}

    def start(self) -> None:
        self._idle.append(self._start_one())

    def _start_one(self) -> Endpoint:
        server = RedisServerProcess()
        endpoint = server.start()       # raises BackendUnavailable; then there is nothing to stop
        with self._lock:
            self._servers.append(server)
            self._by_endpoint[endpoint] = server
        return endpoint

    def _owns(self, endpoint: Endpoint) -> bool:
        return endpoint in self._by_endpoint

    def _fresh(self, endpoint: Endpoint) -> Endpoint:
        return endpoint if self._reset(endpoint) else self._replace(endpoint)

    def _reset(self, endpoint: Endpoint) -> bool:
        """Empty the server for the next check; False if it is no longer as it started (an earlier check's script
        set a password, changed an ACL user or the configuration, paused clients, ...) and must be replaced."""
        server = self._by_endpoint.get(endpoint)
        try:
            with endpoint.client(socket_timeout=2, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0)) as client:
                if server is not None and server.baseline is not None and server_state(client) != server.baseline:
                    return False
                # the server is ours alone: disconnect what an earlier check's scripts left, then empty it
                client.client_kill_filter(_type="normal", skipme=True)
                client.client_kill_filter(_type="pubsub", skipme=True)
                client.flushall()
                client.script_flush()
                client.function_flush()
            return True
        except redis.RedisError:
            return False

    def _replace(self, endpoint: Endpoint) -> Endpoint:
        with self._lock:
            server = self._by_endpoint.pop(endpoint, None)
            if server in self._servers:
                self._servers.remove(server)
        if server is not None:
            server.stop()
        return self._start_one()

    def stop(self) -> None:
        with self._lock:
            servers, self._servers, self._idle = self._servers, [], []
            self._by_endpoint = {}
        for server in servers:
            server.stop()
