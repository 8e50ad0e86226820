"""A grading's private servers (redis-server processes, the fake backend's server process) end with the grading,
however it ends: SIGTERM (a CI timeout, a batch supervisor) or SIGKILL included."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import alive, wait_until
from retrylab.fixtures.backoff_dlq import corpus

LIMIT = 60.0
# a worker that spins without I/O until the CPU rule stops it: a grading of several seconds, however fast
# the harness, so the servers are caught while the checks use them (the reference is graded in under one)
SLOW = next(e for e in corpus.entries("hostile") if e.name == "spin-without-io")


def _children(pid: int) -> dict[int, str]:
    """pid -> command line of the direct children of `pid`."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    found[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
    return found


def _servers(pid: int) -> dict[int, str]:
    """The grading's server processes: redis-server, or the fake server (`retrylab check` forks it: a child with the
    grading's own command line; started as an interpreter, it runs fake_server_process)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        grading = f.read().replace(b"\0", b" ").decode(errors="replace")
    return {p: c for p, c in _children(pid).items()
            if "redis-server" in c or "fake_server_process" in c or c == grading}


@pytest.mark.parametrize("backend, count", [("redis-server", 1), ("fake", 1)])
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_servers_end_when_the_grading_is_killed(backend, count, how, tmp_path):
    submission = SLOW.materialize(tmp_path / "submission")
    grading = subprocess.Popen([sys.executable, "-m", "retrylab", "check", str(submission), "--backend", backend],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + LIMIT
        first_seen: dict[int, float] = {}
        while True:                        # `check` probes the backend first (a server for a moment): skip that
            assert grading.poll() is None, "the grading ended before its servers were seen"
            assert time.monotonic() < deadline, "the grading's servers never showed up"
            servers = _servers(grading.pid)
            now = time.monotonic()
            for pid in servers:
                first_seen.setdefault(pid, now)
            if len([p for p in servers if now - first_seen[p] > 1.0]) >= count:
                break                      # mid-grading: the checks are using them
            time.sleep(0.05)
        grading.send_signal(how)           # the grading process only, as a CI runner's timeout does
        grading.wait(LIMIT)
        wait_until(lambda: not [c for p, c in servers.items() if alive(p)], "the servers to end with their grading",
                   timeout=10)
    finally:
        if grading.poll() is None:
            os.killpg(grading.pid, signal.SIGKILL)
            grading.wait()
