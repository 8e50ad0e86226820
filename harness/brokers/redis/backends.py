"""The kinds of Redis the checks can run against, by the name --backend takes, and `make_backend`.

fake (fakeredis in a child process), redis-server (private processes), url (a database on a server the
user names) and container (Redis containers on a Docker engine): one module each beside this one."""
from __future__ import annotations

import importlib

from retrylab.brokers import BackendUnavailable
from retrylab.brokers.redis.backend import Backend

# name -> (module, class), imported when that backend is made: the fake one needs neither redis-py nor Docker
# in the grading process to start its server, so `retrylab check` starts it before it has imported them
BACKENDS = {"fake": ("fake", "FakeBackend"), "redis-server": ("server", "RedisServerBackend"),
            "url": ("url", "UrlBackend"), "container": ("container", "ContainerBackend")}


def make_backend(name: str, *, redis_url: str | None = None) -> Backend:
    try:
        module, cls = BACKENDS[name]
    except KeyError:
        raise BackendUnavailable(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})") from None
    kind = getattr(importlib.import_module(f"retrylab.brokers.redis.{module}"), cls)
    if name == "url":
        if not redis_url:
            raise BackendUnavailable("--backend url grades against a server you name: add --redis-url redis://host:port[/db]")
        return kind(redis_url)
    if redis_url:
        raise BackendUnavailable(f"--redis-url names a server for --backend url, not for --backend {name}")
    return kind()
