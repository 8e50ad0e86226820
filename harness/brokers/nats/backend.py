"""The nats-server backend: private `nats-server -js` processes (server_process) for a whole grading.

One server serves the checks run one after another, emptied before each (every stream deleted: the
consumers, key-value and object stores go with them); a private server taken while another is in use
(work run alongside) gets a server of its own, started then and kept for reuse. A server that cannot be
emptied (it stopped answering, a learner's script left it unusable) is replaced by a new one.
"""
from __future__ import annotations

import contextlib
import threading

from retrylab.brokers.nats.admin import NatsError
from retrylab.brokers.nats.endpoint import Endpoint
from retrylab.brokers.nats.server_process import NatsServerProcess


class NatsServerBackend:
    name = "nats-server"
    independent_privates = True     # two private servers never share anything

    def __init__(self, binary: str | None = None):
        self._binary = binary
        self._lock = threading.Lock()
        self._idle: list[Endpoint] = []
        self._servers: dict[Endpoint, NatsServerProcess] = {}

    def start(self) -> None:
        """Start the first server (BackendUnavailable, one line, if the pinned nats-server cannot run here)."""
        endpoint = self._start_one()
        with self._lock:
            self._idle.append(endpoint)

    def probe(self) -> None:
        self.start()
        self.stop()

    def stop(self) -> None:
        with self._lock:
            servers, self._servers, self._idle = list(self._servers.values()), {}, []
        for server in servers:
            server.stop()

    def server(self, endpoint: Endpoint) -> NatsServerProcess | None:
        """The process behind one of this backend's endpoints (tests, measurements)."""
        with self._lock:
            return self._servers.get(endpoint)

    @contextlib.contextmanager
    def private(self):
        """An empty server for one check (see the module's text)."""
        with self._lock:
            endpoint = self._idle.pop() if self._idle else None
        endpoint = self._fresh(endpoint) if endpoint is not None else self._start_one()
        try:
            yield endpoint
        finally:
            with self._lock:
                if endpoint in self._servers:   # not if the grading stopped meanwhile
                    self._idle.append(endpoint)

    def _start_one(self) -> Endpoint:
        server = NatsServerProcess(self._binary)
        endpoint = server.start()       # raises BackendUnavailable; then there is nothing to stop
        with self._lock:
            self._servers[endpoint] = server
        return endpoint

    def _fresh(self, endpoint: Endpoint) -> Endpoint:
        try:
            empty(endpoint)
            return endpoint
        except NatsError:
            with self._lock:
                server = self._servers.pop(endpoint, None)
            if server is not None:
                server.stop()
            return self._start_one()


def empty(endpoint: Endpoint) -> None:
    """Delete every stream on the server (NatsError if it cannot be done, or some remain)."""
    with endpoint.admin() as admin:
        for name in admin.paged("STREAM.NAMES", "streams"):
            admin.js(f"STREAM.DELETE.{name}")
        if admin.js("STREAM.NAMES").get("streams"):
            raise NatsError("streams remain after deleting them all")
