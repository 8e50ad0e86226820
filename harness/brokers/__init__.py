"""Brokers: each kind (redis, nats, kafka, ...) in a package of its own under harness/brokers/<kind>/.

The engine knows brokers only through this interface; an exercise names the kind it needs in its
exercise.toml (`broker = "redis"`). A broker package `retrylab.brokers.<kind>` exposes `BROKER`, a
`Broker`, which gives:

- its backends (kinds of private server: e.g. fake, redis-server, url, container) and the options
  they take (`retrylab.options.Option`, declared once for argparse and pytest);
- `fixtures`: the pytest plugin module with its fixtures (an exercise loads it through `pytest_plugins`);
- `learner_imports`: the client libraries learner code imports (the sandbox's probe checks them);
- `link(endpoint, sandbox, run_clock)`: what a learner run needs of a private server (the recording
  relay in front of it, the learner's environment, the commands seen, a snapshot of the state), see
  `LearnerLink`.
"""
from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Callable, Protocol


class BackendUnavailable(RuntimeError):
    """The harness cannot provide a server of this kind here (exit status 2, one line)."""


class LearnerLink(Protocol):
    """A learner run's way to its private server, set up for one run and closed after it."""

    env: dict[str, str]                 # what the learner's process is given to reach the server

    def commands(self) -> list:         # what the learner sent, in order (the broker's own record type)
        ...

    def shape(self) -> Any:             # a cheap, comparable summary of the server's state (progress)
        ...

    def snapshot(self) -> dict:         # the server's whole state, bounded (what checks read)
        ...


class Backend(Protocol):
    name: str
    independent_privates: bool          # two private servers may be in use at once

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def probe(self) -> None: ...        # BackendUnavailable, one line, when it cannot work here
    def private(self) -> contextlib.AbstractContextManager: ...   # yields an endpoint, fresh and empty


@dataclass(frozen=True)
class Broker:
    kind: str                                   # "redis"
    backends: tuple[str, ...]                   # what --backend accepts for an exercise on this broker
    default_backend: str                        # the embedded one: needs nothing installed
    private_backends: tuple[str, ...]           # backends that start their own servers (batch, watch)
    make_backend: Callable[..., Backend]        # make_backend(name, **options from `options`)
    fixtures: str                               # pytest plugin module with this broker's fixtures
    learner_imports: tuple[str, ...] = ()       # client libraries learner code imports
    options: tuple = field(default=())          # retrylab.options.Option, broker-specific (e.g. --redis-url)


@cache
def get(kind: str) -> Broker:
    try:
        module = importlib.import_module(f"retrylab.brokers.{kind}")
    except ModuleNotFoundError as exc:
        if exc.name != f"retrylab.brokers.{kind}":
            raise
        raise LookupError(f"unknown broker {kind!r}") from None
    return module.BROKER
