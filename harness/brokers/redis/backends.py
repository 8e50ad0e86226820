"""The kinds of Redis the checks can run against, by the name --backend takes, and `make_backend`.

fake (fakeredis in a child process), redis-server (private processes), url (a database on a server the
user names) and container (Redis containers on a Docker engine): one module each beside this one."""
from __future__ import annotations

from retrylab.brokers import BackendUnavailable
from retrylab.brokers.redis.backend import Backend
from retrylab.brokers.redis.container import ContainerBackend
from retrylab.brokers.redis.fake import FakeBackend
from retrylab.brokers.redis.server import RedisServerBackend
from retrylab.brokers.redis.url import UrlBackend

BACKENDS = {"fake": FakeBackend, "redis-server": RedisServerBackend, "url": UrlBackend,
            "container": ContainerBackend}


def make_backend(name: str, *, redis_url: str | None = None) -> Backend:
    try:
        kind = BACKENDS[name]
    except KeyError:
        raise BackendUnavailable(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})") from None
    if kind is UrlBackend:
        if not redis_url:
            raise BackendUnavailable("--backend url grades against a server you name: add --redis-url redis://host:port[/db]")
        return UrlBackend(redis_url)
    if redis_url:
        raise BackendUnavailable(f"--redis-url names a server for --backend url, not for --backend {name}")
    return kind()
