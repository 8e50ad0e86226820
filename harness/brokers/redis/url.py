"""The url backend: one database, claimed while in use, on a Redis server the user names (--redis-url)."""
from __future__ import annotations

import contextlib
import secrets
import urllib.parse

import redis

from retrylab.brokers import BackendUnavailable, urls
from retrylab.brokers.redis.backend import Backend
from retrylab.brokers.redis.endpoint import Endpoint


CLAIM_KEY = "retrylab:claim"   # in the database a `url` grading uses: whose it is, until when
CLAIM_TTL = 600                # seconds; renewed by every check, so only a crashed grading's claim lapses
_NO_SUCH_DB = "db {db} does not exist on this server"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def _split(redis_url: str) -> urllib.parse.SplitResult:
    """--redis-url split, its port readable; BackendUnavailable (one line, no password) for one not to be used."""
    try:
        parts = urls.split(redis_url)
    except urls.BadUrl as exc:
        raise BackendUnavailable(f"--redis-url {urls.shown_url(redis_url)!r}: {exc}") from None
    if parts.scheme != "redis":
        raise BackendUnavailable(
            f"--redis-url {urls.shown_url(redis_url)!r}: only redis://host:port[/db] URLs can be used"
            " (learners' connections are relayed over plain TCP; no TLS, no unix sockets)")
    return parts


def _database_index(parts: urllib.parse.SplitResult, shown: str) -> int | None:
    """The database the URL (`shown`: without credentials) names, its path, else ?db=; None for none."""
    db = parts.path.strip("/") or urllib.parse.parse_qs(parts.query).get("db", [""])[0]
    if db and not (db.isascii() and db.isdigit()):    # '²' is a digit to str.isdigit, not to int()
        raise BackendUnavailable(f"--redis-url {shown!r}: the database index {db!r} is not a number")
    return int(db) if db else None


class UrlBackend(Backend):
    """An existing Redis server the user names (`--redis-url redis://host:port[/db]`).

    It may hold other people's data, so the harness works in one database that is empty when it
    starts, claims it with a marker key (`CLAIM_KEY`: a token of this grading, with a TTL), and
    empties it before each check only while the marker is still its own. Without a database index
    in the URL it takes the first empty one of 1-15 (0 is where other programs keep their data).
    At the end it empties that database again, marker included. The learner's scripts reach it
    through the recording proxy; the learner site selects the same database (RETRYLAB_REDIS_DB).
    """

    name = "url"
    SCAN = range(1, 16)

    def __init__(self, redis_url: str):
        parts = _split(redis_url)
        self._host = parts.hostname or "localhost"
        self._port = parts.port or 6379
        self._username = urllib.parse.unquote(parts.username) if parts.username else None
        self._password = urllib.parse.unquote(parts.password) if parts.password else None
        self._db = _database_index(parts, urls.shown_url(redis_url))
        self.where = urls.address("redis", self._host, self._port)   # never the credentials
        self._token = secrets.token_hex(16)
        self._endpoint: Endpoint | None = None
        self._client: redis.Redis | None = None

    def _endpoint_for(self, db: int) -> Endpoint:
        return Endpoint(self._host, self._port, db, self._username, self._password, shared=True)

    def start(self) -> None:
        try:
            with self._endpoint_for(0).client(socket_connect_timeout=5) as client:
                client.ping()
        except redis.RedisError as exc:
            raise BackendUnavailable(f"cannot use Redis at {self.where}: {_one_line(exc)}") from None
        if self._db is not None:
            problem = self._claim(self._db)
            if problem:
                raise BackendUnavailable(f"{self.where}/{self._db}: {problem}; name an empty database"
                                         " or leave the index out to let retrylab find one")
            return
        for db in self.SCAN:
            problem = self._claim(db)
            if problem is None:
                return
            if problem == _NO_SUCH_DB.format(db=db):
                break
        raise BackendUnavailable(f"no empty database on {self.where} (db 1-15 hold keys retrylab did not"
                                 f" create, or are in use): name an empty one, e.g. {self.where}/N")

    def _claim(self, db: int) -> str | None:
        """Claim database `db` if it is empty: None, else why not (a phrase)."""
        client = self._endpoint_for(db).client(socket_connect_timeout=5)
        try:
            problem = self._try_claim(client, db)
        except redis.ResponseError as exc:
            problem = _NO_SUCH_DB.format(db=db) if "out of range" in str(exc).lower() else None
            if problem is None:
                client.close()
                raise BackendUnavailable(f"cannot use Redis at {self.where}/{db}: {_one_line(exc)}") from None
        except redis.RedisError as exc:
            client.close()
            raise BackendUnavailable(f"cannot use Redis at {self.where}/{db}: {_one_line(exc)}") from None
        if problem:
            client.close()
        else:
            self._client, self._endpoint = client, self._endpoint_for(db)
        return problem

    def _try_claim(self, client: redis.Redis, db: int) -> str | None:
        if client.exists(CLAIM_KEY):
            return f"db {db} is in use by another retrylab grading (its claim lapses in {client.ttl(CLAIM_KEY)} s)"
        count = client.dbsize()
        if count:
            return f"db {db} holds {count} key(s) retrylab did not create"
        if not client.set(CLAIM_KEY, self._token, nx=True, ex=CLAIM_TTL):
            return f"db {db} was claimed by another retrylab grading just now"
        if client.dbsize() != 1:   # someone else wrote into it meanwhile: leave it to them
            self._release(client, flush=False)
            return f"db {db} received other keys while retrylab claimed it"
        return None

    def _release(self, client: redis.Redis, *, flush: bool) -> bool:
        """Empty (flush) or unclaim the database if the claim is still ours; whether it was."""
        with client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(CLAIM_KEY)
                    owner = pipe.get(CLAIM_KEY)
                    # No marker: a learner's script deleted it (FLUSHDB). What is there came from this
                    # grading's checks; another grading would only claim an empty database.
                    if owner not in (None, self._token.encode()):
                        return False
                    pipe.multi()
                    if flush:
                        pipe.flushdb()
                    else:
                        pipe.delete(CLAIM_KEY)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue

    @property
    def endpoint(self) -> Endpoint | None:
        return self._endpoint

    def stop(self) -> None:
        if self._client is not None:
            try:
                self._release(self._client, flush=True)
            finally:
                self._client.close()
                self._client = None

    @contextlib.contextmanager
    def private(self):
        client = self._client
        with client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(CLAIM_KEY)
                    owner = pipe.get(CLAIM_KEY)
                    if owner not in (None, self._token.encode()):
                        raise BackendUnavailable(f"{self._endpoint.url} was claimed by another grading"
                                                 " while this one ran")
                    pipe.multi()
                    pipe.flushdb()
                    pipe.set(CLAIM_KEY, self._token, ex=CLAIM_TTL)
                    pipe.execute()
                    break
                except redis.WatchError:
                    continue
        yield self._endpoint
