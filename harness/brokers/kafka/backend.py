"""The tansu backend: a fresh private Tansu broker for every check that asks for one.

Not a pool of reused brokers, as the redis-server backend keeps: a Kafka broker cannot be emptied as
FLUSHALL empties Redis (topics can be deleted, but consumer groups, committed offsets and producer
ids stay), and a Tansu process starts in 0.04 s and keeps nothing from the one before it. `start()`
starts the first one (so a broker that cannot run here ends the grading at once, exit status 2), which
the first check takes."""
from __future__ import annotations

import contextlib
import threading

from retrylab.brokers import BackendUnavailable
from retrylab.brokers.kafka.endpoint import Endpoint
from retrylab.brokers.kafka.tansu import TansuProcess


class TansuBackend:
    name = "tansu"
    independent_privates = True     # every private broker is a process of its own

    def __init__(self, binary: str | None = None):
        self._binary = binary
        self._lock = threading.Lock()
        self._ready: list[TansuProcess] = []    # started, not yet handed out
        self._running: set[TansuProcess] = set()
        self._stopped = False

    def start(self) -> None:
        self._stopped = False
        broker = self._start_one()
        with self._lock:
            self._ready.append(broker)

    def probe(self) -> None:
        self.start()
        self.stop()

    def _start_one(self) -> TansuProcess:
        broker = TansuProcess(self._binary)     # BackendUnavailable: missing, or not the pinned version
        with self._lock:
            if self._stopped:
                raise BackendUnavailable("the grading is ending: no Kafka broker is started")
            self._running.add(broker)
        try:
            broker.start()
        except BaseException:
            with self._lock:
                self._running.discard(broker)
            broker.stop()
            raise
        return broker

    @contextlib.contextmanager
    def private(self):
        with self._lock:
            broker = self._ready.pop() if self._ready else None
        broker = broker or self._start_one()
        try:
            yield Endpoint("127.0.0.1", broker.port)
        finally:
            with self._lock:
                self._running.discard(broker)
            broker.stop()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            brokers, self._running, self._ready = self._running, set(), []
        for broker in brokers:
            broker.stop()


def make_backend(name: str) -> TansuBackend:
    if name != TansuBackend.name:
        raise BackendUnavailable(f"unknown backend {name!r} for a Kafka exercise (choose from {TansuBackend.name})")
    return TansuBackend()
