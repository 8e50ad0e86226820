"""The kinds of NATS the checks can run against, by the name --backend takes: `nats-server` (private
processes of the pinned nats-server, the default). A server the user names is only read, by `verify`
(live.py), never graded on: a grading creates and deletes streams."""
from __future__ import annotations

from retrylab.brokers import BackendUnavailable
from retrylab.brokers.nats.backend import NatsServerBackend

BACKENDS = {"nats-server": NatsServerBackend}


def make_backend(name: str) -> NatsServerBackend:
    try:
        return BACKENDS[name]()
    except KeyError:
        raise BackendUnavailable(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})") from None
