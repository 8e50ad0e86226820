"""Redis for checks: the embedded fake, a private redis-server process, a database on a server the
user names (url), or Redis containers on a Docker engine (retrylab.brokers.redis.containers)."""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from retrylab import tempdirs
from retrylab.brokers import BackendUnavailable  # one class for every broker: the CLI catches it
from retrylab.spawn import server_uid, spawn_server


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
        return f"redis://{self.host}:{self.port}/{self.db}"

    def client(self, **kwargs) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 10)
        return redis.Redis(host=self.host, port=self.port, db=self.db, username=self.username,
                           password=self.password, **kwargs)


# Every private redis-server: a memory limit (a learner's memory bomb gets OOM errors, not the machine's memory),
# and nothing on disk.
REDIS_SERVER_LIMITS = ("--maxmemory", "256mb", "--maxmemory-policy", "noeviction")


class RedisServerProcess:
    """A private `redis-server` on a free port that keeps nothing on disk, has a memory limit, and dies with the
    grading (see spawn_server)."""

    def __init__(self, binary: str = "redis-server"):
        path = shutil.which(binary)
        if path is None:
            raise BackendUnavailable(f"{binary} is not on PATH; install Redis or use --backend fake")
        self._binary = path
        self._proc: subprocess.Popen | None = None
        self._dir: Path | None = None
        self.endpoint: Endpoint | None = None
        self.baseline: tuple | None = None   # server_state() when it started

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> Endpoint:
        self._dir = tempdirs.make("redis")
        uid = server_uid()      # as root: not root (a flaw in Redis' Lua sandbox would reach no one's files)
        if uid is not None:
            os.chown(self._dir, uid, uid)
        for _ in range(5):  # a free port can be taken between probing and binding: retry
            port = free_port()
            self._proc = spawn_server(
                [self._binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(self._dir), "--protected-mode", "no", *REDIS_SERVER_LIMITS],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                **({"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}))
            endpoint = Endpoint("127.0.0.1", port)
            if self._wait_ready(endpoint):
                self.endpoint = endpoint
                with endpoint.client() as client:
                    self.baseline = server_state(client)
                return endpoint
            self._stop_process()
        raise BackendUnavailable("redis-server did not start on a free port (5 tries)")

    def _wait_ready(self, endpoint: Endpoint, limit: float = 5.0) -> bool:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                # Only our own process counts: between probing the port and binding it, another server (a
                # parallel grader's redis-server, a proxy, a fake server) may have taken it; our redis-server
                # then exits, but until it does a ping would be answered by the stranger.
                with endpoint.client(socket_connect_timeout=0.2) as client:
                    return client.info("server").get("process_id") == self._proc.pid
            except redis.RedisError:
                time.sleep(0.01)
        return False

    def _stop_process(self) -> None:
        if self._proc and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)   # its group: itself, and any child it forked
            self._proc.kill()
            self._proc.wait()

    def stop(self) -> None:
        self._stop_process()
        if self._dir:
            tempdirs.remove_tree(self._dir)
            self._dir = None

    def __enter__(self) -> Endpoint:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def server_state(client: redis.Redis) -> tuple:
    """What a check's script could change on a server that outlives the check (configuration, users, modules,
    replication): compared with the state at start before a server is reused."""
    config = client.config_get("*")
    return (tuple(sorted(config.items())), tuple(client.acl_list()), repr(client.module_list()),
            client.role()[0])


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


class FakeBackend(Backend):
    """fakeredis' TCP server: nothing to install. It runs in a child process of the grading, unprivileged, that
    dies with it (retrylab.brokers.redis.fake_server_process). A new server per private Redis, so no state (and no client still
    blocked from an earlier run) can leak from one check into another."""

    name = "fake"
    independent_privates = True

    def __init__(self):
        from retrylab.brokers.redis.fake_server_process import FakeServerProcess
        self._servers = FakeServerProcess()

    def start(self) -> None:
        self._servers.start()       # the child warms up while the grading starts; private() waits for it

    def stop(self) -> None:
        self._servers.stop()

    def probe(self) -> None:
        pass                        # nothing to install: fakeredis is a dependency

    @contextlib.contextmanager
    def private(self):
        port = self._servers.new_server()
        try:
            yield Endpoint("127.0.0.1", port)
        finally:
            self._servers.stop_server(port)


class RedisServerBackend(Backend):
    """Private redis-server processes for the whole grading, each emptied for every check that uses it.

    One process serves the checks run one after another; a check's private Redis taken while another
    is in use (work run alongside, see `independent_privates`) gets a second process, started then
    and kept for reuse, so no two private Redis ever share a server."""

    name = "redis-server"
    independent_privates = True

    def __init__(self):
        self._lock = threading.Lock()
        self._servers: list[RedisServerProcess] = []
        self._idle: list[Endpoint] = []
        self._by_endpoint: dict[Endpoint, RedisServerProcess] = {}

    def start(self) -> None:
        self._idle.append(self._start_one())

    def _start_one(self) -> Endpoint:
        server = RedisServerProcess()
        endpoint = server.start()       # raises BackendUnavailable; then there is nothing to stop
        with self._lock:
            self._servers.append(server)
            self._by_endpoint[endpoint] = server
        return endpoint

    def _reset(self, endpoint: Endpoint) -> bool:
        """Empty the server for the next check; False if it is no longer as it started (an earlier check's script
        set a password, changed an ACL user or the configuration, paused clients, ...) and must be replaced."""
        server = self._by_endpoint.get(endpoint)
        try:
            with endpoint.client(socket_timeout=2, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0)) as client:
                if server is not None and server.baseline is not None and server_state(client) != server.baseline:
                    return False
                # the server is ours alone: disconnect what an earlier check's scripts left, then empty it
                client.client_kill_filter(_type="normal", skipme=True)
                client.client_kill_filter(_type="pubsub", skipme=True)
                client.flushall()
                client.script_flush()
                client.function_flush()
            return True
        except redis.RedisError:
            return False

    def _replace(self, endpoint: Endpoint) -> Endpoint:
        with self._lock:
            server = self._by_endpoint.pop(endpoint, None)
            if server in self._servers:
                self._servers.remove(server)
        if server is not None:
            server.stop()
        return self._start_one()

    def stop(self) -> None:
        with self._lock:
            servers, self._servers, self._idle = self._servers, [], []
            self._by_endpoint = {}
        for server in servers:
            server.stop()

    @contextlib.contextmanager
    def private(self):
        with self._lock:
            endpoint = self._idle.pop() if self._idle else None
        endpoint = endpoint or self._start_one()
        try:
            if not self._reset(endpoint):
                endpoint = self._replace(endpoint)
            yield endpoint
        finally:
            with self._lock:
                self._idle.append(endpoint)


CLAIM_KEY = "retrylab:claim"   # in the database a `url` grading uses: whose it is, until when
CLAIM_TTL = 600                # seconds; renewed by every check, so only a crashed grading's claim lapses
_NO_SUCH_DB = "db {db} does not exist on this server"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


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
        parts = urllib.parse.urlsplit(redis_url)
        if parts.scheme != "redis":
            raise BackendUnavailable(
                f"--redis-url {redis_url!r}: only redis://host:port[/db] URLs can be used"
                " (learners' connections are relayed over plain TCP; no TLS, no unix sockets)")
        try:
            port = parts.port or 6379
        except ValueError:
            raise BackendUnavailable(f"--redis-url {redis_url!r}: the port is not a number") from None
        self._host = parts.hostname or "localhost"
        self._port = port
        self._username = urllib.parse.unquote(parts.username) if parts.username else None
        self._password = urllib.parse.unquote(parts.password) if parts.password else None
        db = parts.path.strip("/") or urllib.parse.parse_qs(parts.query).get("db", [""])[0]
        if db and not db.isdigit():
            raise BackendUnavailable(f"--redis-url {redis_url!r}: the database index {db!r} is not a number")
        self._db = int(db) if db else None
        self.where = f"redis://{self._host}:{self._port}"   # never the credentials
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


def _docker_engine():
    """A docker-py client for an engine that answers, or BackendUnavailable (within seconds)."""
    from retrylab.brokers.redis import containers
    return containers.docker_engine()


class ContainerBackend(Backend):
    """Redis containers on a Docker engine (retrylab.brokers.redis.containers), from the image `retrylab/redis` made
    from this machine's redis-server (`python -m retrylab.brokers.redis.container_image`) or RETRYLAB_REDIS_IMAGE.

    Like redis-server: one container serves the checks run one after another, emptied for each; a
    private Redis taken while another is in use gets a container of its own, started then and kept
    for reuse. Every container is removed when the grading ends (see retrylab.brokers.redis.containers for SIGTERM
    and for gradings killed outright)."""

    name = "container"
    independent_privates = True

    def __init__(self, image: str | None = None):
        from retrylab.brokers.redis import containers
        self.image = image or containers.image_name()
        self._lock = threading.Lock()
        self._ids: dict[Endpoint, str] = {}     # container ids by where they answer
        self._idle: list[Endpoint] = []
        self._sigterm: contextlib.ExitStack | None = None
        self._creating = 0          # containers on their way in other threads (the advanced run's, say)
        self._stopped = False

    def probe(self) -> None:
        """Engine, image and a container that answers, before grading: each failure is one line."""
        self.start()
        self.stop()

    def start(self) -> None:
        from retrylab.brokers.redis import containers
        with contextlib.closing(_docker_engine()) as engine:
            containers.sweep_stale(engine)
            containers.ensure_image_present(engine, self.image)
        self._stopped = False
        self._sigterm = contextlib.ExitStack()
        self._sigterm.enter_context(containers.removed_on_sigterm())
        try:
            self._idle.append(self._start_one())
        except BaseException:
            self.stop()
            raise

    def _start_one(self) -> Endpoint:
        from retrylab.brokers.redis import containers
        with self._lock:
            self._creating += 1
        try:
            container_id, endpoint = containers.start_redis_container(self.image)
            with self._lock:
                late = self._stopped
                if not late:
                    self._ids[endpoint] = container_id
            if late:   # the grading ended (an interrupt) while this one was being made: it goes at once
                containers.remove_containers([container_id])
                containers.OWNED.discard(container_id)
                raise BackendUnavailable("the grading ended while a Redis container was starting")
            return endpoint
        finally:
            with self._lock:
                self._creating -= 1

    def stop(self) -> None:
        from retrylab.brokers.redis import containers
        with self._lock:
            self._stopped = True
        # containers still being made by other threads remove themselves (above): wait for that, or
        # this process may end first and leave them running
        deadline = time.monotonic() + containers.API_TIMEOUT
        while self._creating and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            ids, self._ids, self._idle = list(self._ids.values()), {}, []
        containers.remove_containers(ids)
        for container_id in ids:
            containers.OWNED.discard(container_id)
        if self._sigterm is not None:
            self._sigterm.close()
            self._sigterm = None

    @contextlib.contextmanager
    def private(self):
        with self._lock:
            endpoint = self._idle.pop() if self._idle else None
        endpoint = endpoint or self._start_one()
        try:
            _empty(endpoint)
        except redis.ConnectionError:   # an earlier check's script stopped that server (SHUTDOWN): replace it
            self._drop(endpoint)
            endpoint = self._start_one()
            _empty(endpoint)
        try:
            yield endpoint
        finally:
            with self._lock:
                if endpoint in self._ids:
                    self._idle.append(endpoint)

    def _drop(self, endpoint: Endpoint) -> None:
        from retrylab.brokers.redis import containers
        with self._lock:
            container_id = self._ids.pop(endpoint, None)
        if container_id:
            containers.remove_containers([container_id])
            containers.OWNED.discard(container_id)


def _empty(endpoint: Endpoint) -> None:
    """A container's Redis as new: disconnect what an earlier check's scripts left (through the port
    mapping their connections may outlive them a little), then empty it: keys, scripts, functions."""
    with endpoint.client() as client:
        client.client_kill_filter(_type="normal", skipme=True)
        client.flushall()
        client.script_flush()
        with contextlib.suppress(redis.ResponseError):   # functions: Redis 7 and later
            client.function_flush()


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
