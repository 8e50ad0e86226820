"""The container backend: Redis containers on a Docker engine (the engine side is retrylab.brokers.redis.containers)."""
from __future__ import annotations

import contextlib
import time

import redis

from retrylab.brokers import BackendUnavailable
from retrylab.brokers.redis.backend import ServerPool
from retrylab.brokers.redis.endpoint import Endpoint


def _docker_engine():
    """A docker-py client for an engine that answers, or BackendUnavailable (within seconds)."""
    from retrylab.brokers.redis import containers
    return containers.docker_engine()


class ContainerBackend(ServerPool):
    """Redis containers on a Docker engine (retrylab.brokers.redis.containers), from the image `retrylab/redis` made
    from this machine's redis-server (`python -m retrylab.brokers.redis.container_image`) or RETRYLAB_REDIS_IMAGE.

    A ServerPool, like redis-server: one container serves the checks run one after another, emptied for each; a
    private Redis taken while another is in use gets a container of its own, started then and kept
    for reuse. Every container is removed when the grading ends (see retrylab.brokers.redis.containers for SIGTERM
    and for gradings killed outright)."""

    name = "container"

    def __init__(self, image: str | None = None):
        from retrylab.brokers.redis import containers
        super().__init__()
        self.image = image or containers.image_name()
        self._ids: dict[Endpoint, str] = {}     # container ids by where they answer
        self._sigterm: contextlib.ExitStack | None = None
        self._creating = 0          # containers on their way in other threads (the advanced run's, say)
        self._stopped = False

    def probe(self) -> None:
        """Engine, image and a container that answers, before grading: each failure is one line."""
        self.start()
        self.stop()

    def start(self) -> None:
        from retrylab.brokers.redis import containers
        with contextlib.closing(_docker_engine()) as engine:
            containers.sweep_stale(engine)
            containers.ensure_image_present(engine, self.image)
        self._stopped = False
        self._sigterm = contextlib.ExitStack()
        self._sigterm.enter_context(containers.removed_on_sigterm())
        try:
            self._idle.append(self._start_one())
        except BaseException:
            self.stop()
            raise

    def _start_one(self) -> Endpoint:
        from retrylab.brokers.redis import containers
        with self._lock:
            if self._stopped:   # the grading is ending (an interrupt): no new container, none left behind
                raise BackendUnavailable("the grading ended before a Redis container was started")
            self._creating += 1
        try:
            container_id, endpoint = containers.start_redis_container(self.image)
            with self._lock:
                late = self._stopped
                if not late:
                    self._ids[endpoint] = container_id
            if late:   # the grading ended (an interrupt) while this one was being made: it goes at once
                containers.remove_containers([container_id])
                containers.OWNED.discard(container_id)
                raise BackendUnavailable("the grading ended while a Redis container was starting")
            return endpoint
        finally:
            with self._lock:
                self._creating -= 1

    def stop(self) -> None:
        from retrylab.brokers.redis import containers
        with self._lock:
            self._stopped = True
        # containers still being made by other threads remove themselves (above): wait for that, or
        # this process may end first and leave them running
        deadline = time.monotonic() + containers.API_TIMEOUT
        while self._creating and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            ids, self._ids, self._idle = list(self._ids.values()), {}, []
        containers.remove_containers(ids)
        for container_id in ids:
            containers.OWNED.discard(container_id)
        if self._sigterm is not None:
            self._sigterm.close()
            self._sigterm = None

    def _owns(self, endpoint: Endpoint) -> bool:
        return endpoint in self._ids

    def _fresh(self, endpoint: Endpoint) -> Endpoint:
        try:
            _empty(endpoint)
        except redis.ConnectionError:   # an earlier check's script stopped that server (SHUTDOWN): replace it
            self._drop(endpoint)
            endpoint = self._start_one()
            _empty(endpoint)
        return endpoint

    def _drop(self, endpoint: Endpoint) -> None:
        from retrylab.brokers.redis import containers
        with self._lock:
            container_id = self._ids.pop(endpoint, None)
        if container_id:
            containers.remove_containers([container_id])
            containers.OWNED.discard(container_id)


def _empty(endpoint: Endpoint) -> None:
    """A container's Redis as new: disconnect what an earlier check's scripts left (through the port
    mapping their connections may outlive them a little), then empty it: keys, scripts, functions."""
    with endpoint.client() as client:
        client.client_kill_filter(_type="normal", skipme=True)
        client.flushall()
        client.script_flush()
        with contextlib.suppress(redis.ResponseError):   # functions: Redis 7 and later
            client.function_flush()
