"""A learner's own Redis, read-only, for `retrylab verify` (a lab platform's check button).

Unlike a grading's private servers, this Redis is the learner's: `LiveRedis` never writes to it. The
only commands it sends are TYPE, LLEN and LRANGE (plus what redis-py sends to connect), so it can run
as a Redis user that may only read.
"""
from __future__ import annotations

from dataclasses import dataclass

import redis

from retrylab.brokers import urls
from retrylab.brokers.redis import catalog
from retrylab.verify import CannotCheck

LIST_READ = 100          # entries read from a list; the lab's lists hold one or a few


@dataclass(frozen=True)
class ListState:
    key: str
    type: str                    # "list", "none" (no such key), or another Redis type
    length: int
    items: tuple[bytes, ...]     # the first LIST_READ entries


class LiveRedis:
    """The learner's own Redis. Read-only by construction: `list_state` is the only operation, and
    it sends TYPE, LLEN and LRANGE. Connects on first use, so file-only steps never touch Redis."""

    def __init__(self, url: str):
        self.url = url
        self.shown = urls.shown_url(url)
        self.used = False
        self._client: redis.Redis | None = None

    def _connect(self) -> redis.Redis:
        if self._client is None:
            try:
                urls.split(self.url)    # what redis-py would misread (a password with a '#') or raise on (a port 'x')
                self._client = redis.Redis.from_url(self.url, socket_connect_timeout=3, socket_timeout=5)
            except ValueError as exc:   # urls.BadUrl, or redis-py's: a scheme it does not know
                raise CannotCheck(catalog.text("verify.bad_url", None, url=self.shown, error=exc)) from None
        return self._client

    def list_state(self, key: str) -> ListState:
        self.used = True
        try:
            client = self._connect()
            kind = client.type(key)
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            if kind != "list":
                return ListState(key, kind, 0, ())
            return ListState(key, kind, int(client.llen(key)), tuple(client.lrange(key, 0, LIST_READ - 1)))
        except redis.RedisError as exc:
            reason = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise CannotCheck(catalog.text("verify.unreadable", None, url=self.shown, reason=reason)) from None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
