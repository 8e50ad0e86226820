"""What every kind of Redis backend shares: the `Backend` defaults, and the pool of private servers
that redis-server and container backends both keep (one server per private Redis in use at once,
emptied and reused by the next check)."""
from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:      # not imported for real: the fake backend's start must not wait for redis-py
    from retrylab.brokers.redis.endpoint import Endpoint


class Backend:
    """A kind of Redis the checks run against. `private()` gives one check a private, empty Redis."""

    name = ""
    # True when two private Redis may be in use at once without seeing each other's keys (checks may
    # then run learner scripts alongside each other); False when they share one server or database.
    independent_privates = False

    def start(self) -> None:
        """Prepare (may raise BackendUnavailable); called once per grading."""

    def stop(self) -> None:
        pass

    def probe(self) -> None:
        """Raise BackendUnavailable, quickly, if this backend cannot work here (for a one-line exit 2
        before grading starts)."""
        self.start()
        self.stop()

    def private(self):
        raise NotImplementedError


class ServerPool(Backend):
    """Private servers for the whole grading: one serves the checks run one after another; a private
    Redis taken while another is in use (work run alongside) gets a server of its own, started then and
    kept for reuse, so no two private Redis ever share a server. Subclasses start a server
    (`_start_one`), make one as new for the next check (`_fresh`), and say which are still theirs (`_owns`)."""

    independent_privates = True

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: list[Endpoint] = []

    def _start_one(self) -> Endpoint:
        raise NotImplementedError

    def _fresh(self, endpoint: Endpoint) -> Endpoint:
        """`endpoint` emptied for the next check, or a new server in its place if it cannot be."""
        raise NotImplementedError

    def _owns(self, endpoint: Endpoint) -> bool:
        raise NotImplementedError

    @contextlib.contextmanager
    def private(self):
        with self._lock:
            endpoint = self._idle.pop() if self._idle else None
        endpoint = self._fresh(endpoint or self._start_one())
        try:
            yield endpoint
        finally:
            with self._lock:
                if self._owns(endpoint):   # not if the grading stopped meanwhile
                    self._idle.append(endpoint)
