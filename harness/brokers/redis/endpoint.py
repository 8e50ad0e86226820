"""Where a private Redis answers, and a client for it."""
from __future__ import annotations

import socket
from dataclasses import dataclass, field

import redis

from retrylab.brokers import urls
from retrylab.brokers.redis.link import RedisLink


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    db: int = 0                         # the database index checks (and learners' scripts) use
    username: str | None = field(default=None, repr=False)   # only for a server the user names (url)
    password: str | None = field(default=None, repr=False)
    shared: bool = False                # the server also serves others (url): the relay then refuses more

    @property
    def url(self) -> str:
        """The server and database, without credentials (safe to show)."""
        return f"{urls.address('redis', self.host, self.port)}/{self.db}"

    def link(self, sandbox, run_clock):
        """A learner run's way to this server (retrylab.brokers.LearnerLink), to enter for the run."""
        return RedisLink(self, sandbox, run_clock)

    def client(self, **kwargs) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 10)
        return redis.Redis(host=self.host, port=self.port, db=self.db, username=self.username,
                           password=self.password, **kwargs)
