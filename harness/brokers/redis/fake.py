"""The fake backend: fakeredis servers in an unprivileged child process (nothing to install)."""
from __future__ import annotations

import contextlib
import importlib

from retrylab.brokers.redis.backend import Backend


class FakeBackend(Backend):
    """fakeredis' TCP server: nothing to install. It runs in a child process of the grading, unprivileged,
    that dies with it (retrylab.brokers.redis.fake_server_process). A new server per private Redis, so no
    state (and no client still blocked from an earlier run) can leak from one check into another."""

    name = "fake"
    independent_privates = True

    def __init__(self):
        from retrylab.brokers.redis.fake_server_process import FakeServerProcess
        self._servers = FakeServerProcess()

    def start(self) -> None:
        self._servers.start()       # the child warms up while the grading starts; private() waits for it
        # redis-py, imported now, by the thread that starts the grading, while the child warms up: not first in
        # private(), which the early runs' threads call at once (retrylab.background.Beside says why that hangs)
        importlib.import_module("retrylab.brokers.redis.endpoint")

    def stop(self) -> None:
        self._servers.stop()

    def probe(self) -> None:
        pass                        # nothing to install: fakeredis is a dependency

    @contextlib.contextmanager
    def private(self):
        from retrylab.brokers.redis.endpoint import Endpoint   # imported by start(): a look-up here
        port = self._servers.new_server()
        try:
            yield Endpoint("127.0.0.1", port)
        finally:
            self._servers.stop_server(port)
