"""Private Redis servers for checks: the embedded fake and a real redis-server process."""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

import redis


class BackendUnavailable(RuntimeError):
    """The harness cannot provide a Redis of this kind here (exit status 2, one line)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, socket_timeout=10, **kwargs)


class RedisServerProcess:
    """A private `redis-server` on a free port that keeps nothing on disk."""

    def __init__(self, binary: str = "redis-server"):
        path = shutil.which(binary)
        if path is None:
            raise BackendUnavailable(f"{binary} is not on PATH; install Redis or use --backend fake")
        self._binary = path
        self._proc: subprocess.Popen | None = None
        self._dir: tempfile.TemporaryDirectory | None = None
        self.endpoint: Endpoint | None = None

    def start(self) -> Endpoint:
        self._dir = tempfile.TemporaryDirectory(prefix="retrylab-redis-")
        for _ in range(5):  # a free port can be taken between probing and binding: retry
            port = free_port()
            self._proc = subprocess.Popen(
                [self._binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self._dir.name, "--protected-mode", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
            endpoint = Endpoint("127.0.0.1", port)
            if self._wait_ready(endpoint):
                self.endpoint = endpoint
                return endpoint
            self._stop_process()
        raise BackendUnavailable("redis-server did not start on a free port (5 tries)")

    def _wait_ready(self, endpoint: Endpoint, limit: float = 5.0) -> bool:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                if endpoint.client(socket_connect_timeout=0.2).ping():
                    return True
            except redis.ConnectionError:
                time.sleep(0.01)
        return False

    def _stop_process(self) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def stop(self) -> None:
        self._stop_process()
        if self._dir:
            self._dir.cleanup()

    def __enter__(self) -> Endpoint:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Backend:
    """A kind of Redis the checks run against. `private()` gives one check a private, empty Redis."""

    name = ""

    def start(self) -> None:
        """Prepare (may raise BackendUnavailable); called once per grading."""

    def stop(self) -> None:
        pass

    def private(self):
        raise NotImplementedError


class FakeBackend(Backend):
    """fakeredis' TCP server in a thread: nothing to install. A new server per private Redis, so no
    state (and no client still blocked from an earlier run) can leak from one check into another."""

    name = "fake"

    @contextlib.contextmanager
    def private(self):
        from retrylab.fakeredis_fixes import start_fake_server, stop_fake_server
        server = start_fake_server()
        try:
            yield Endpoint("127.0.0.1", server.port)
        finally:
            stop_fake_server(server)


class RedisServerBackend(Backend):
    """A private redis-server process for the whole grading; emptied for each check."""

    name = "redis-server"

    def __init__(self):
        self._server: RedisServerProcess | None = None
        self._endpoint: Endpoint | None = None

    def start(self) -> None:
        self._server = RedisServerProcess()
        self._endpoint = self._server.start()

    def stop(self) -> None:
        if self._server:
            self._server.stop()

    @contextlib.contextmanager
    def private(self):
        client = self._endpoint.client()
        # the server is ours alone: disconnect whatever an earlier check's scripts left, then empty it
        client.client_kill_filter(_type="normal", skipme=True)
        client.flushall()
        try:
            yield self._endpoint
        finally:
            client.close()


BACKENDS = {"fake": FakeBackend, "redis-server": RedisServerBackend}


def make_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]()
    except KeyError:
        raise BackendUnavailable(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})") from None
