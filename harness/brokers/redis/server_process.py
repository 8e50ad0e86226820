"""A private `redis-server` process (the redis-server backend's servers, and tests that need a real Redis)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import redis

from retrylab import tempdirs
from retrylab.brokers import BackendUnavailable
from retrylab.brokers.redis.endpoint import Endpoint, free_port
from retrylab.spawn import kill_group, server_uid, spawn_server


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
            kill_group(self._proc)   # its group: itself, and any child it forked

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
