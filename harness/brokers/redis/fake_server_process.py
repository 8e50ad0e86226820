"""The fake backend's servers, out of the grading process: one child process per grading hands out a fresh
PatchedTcpFakeServer (on a new port) for every private Redis.

Why a child: the fake server runs whatever a learner's script sends it, EVAL included. In the grading process a
flaw in fakeredis (or its Lua bridge) would be a flaw in the grader; in a child it reaches an unprivileged process
that holds nothing but fake Redis data. The child is started from the grading (retrylab.spawn.spawn_server: its
own process group, killed when the grading dies), imports everything it needs and warms fakeredis' Lua up while
still privileged, then, as root, drops to a fresh unprivileged uid with no capabilities and no_new_privs, and bounds
its own memory. One process per grading keeps the cost to one interpreter start (~0.3 s, overlapped with the
grading's own start); a fresh server per private Redis keeps DESIGN's guarantee that no state, and no killed
client's ghost BLPOP, carries from one check to the next.

Protocol, text lines on the child's stdin and stdout: the parent writes `new`, the child answers with the new
server's port; the parent writes `stop <port>`, nothing is answered (the server stops in the background). The child
writes `ready` once it serves. EOF on stdin (the grading went away) ends it.
"""
from __future__ import annotations

import os
import random
import resource
import select
import signal
import subprocess
import sys
import threading
import time

from retrylab.brokers import BackendUnavailable
from retrylab.spawn import kill_group, spawn_server

UID_RANGE = (2_100_000_000, 2_140_000_000)   # beside the sandbox's learner uids (2.0e9-2.1e9), never a real user
MEMORY_LIMIT = 1536 << 20                    # address space of the child: a memory bomb stops here
THREAD_STACK = 1 << 20                       # each connection is a thread; keep their reserved stacks small
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 1, 38, 24
READY_TIMEOUT = 30.0                         # seconds for the child to start serving (a loaded machine)
ANSWER_TIMEOUT = 10.0                        # seconds for a new server's port


class FakeServerProcess:
    """The parent's handle on the child. Thread-safe; `start()` returns at once, the first `new_server()` waits for
    the child to be ready.

    Every answer is awaited for a bounded time, and an exchange cut short (Ctrl-C while waiting for the child's
    `ready` or a port) ends that child: its next line could no longer be matched to a request, and a thread
    waiting for a `ready` already read by the interrupted one waited for ever (`watch` hung after Ctrl-C in CI).
    The next request starts a new child."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._ready = False
        self._pending = b""          # what the child wrote after the last whole line read

    def start(self) -> FakeServerProcess:
        proc = spawn_server([sys.executable, "-I", "-m", "retrylab.brokers.redis.fake_server_process"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            close_fds=True, bufsize=0)
        with self._lock:
            if self._proc is not None:      # another thread started one meanwhile
                kill_group(proc)
            else:
                self._proc, self._ready, self._pending = proc, False, b""
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _line(self, timeout: float) -> str:
        """The child's next line, within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise BackendUnavailable(f"the fake Redis server process did not answer in {timeout:.0f} s; "
                                         "try --backend redis-server")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise BackendUnavailable("the fake Redis server process ended (exit status "
                                         f"{self._proc.poll()}); try --backend redis-server")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode(errors="replace").strip()

    def new_server(self) -> int:
        if self._proc is None:
            self.start()
        with self._lock:
            if self._proc is None:           # stopped meanwhile (the grading is ending)
                    raise BackendUnavailable("the fake Redis server process was stopped")
            try:
                if not self._ready:
                    if self._line(READY_TIMEOUT) != "ready":
                        raise RuntimeError("the fake Redis server process did not start")
                    self._ready = True
                self._proc.stdin.write(b"new\n")
                return int(self._line(ANSWER_TIMEOUT))
            except BaseException:
                self._discard()
                raise

    def _discard(self) -> None:
        """End the child after an exchange that did not complete (the lock is held)."""
        proc, self._proc, self._ready, self._pending = self._proc, None, False, b""
        if proc is not None:
            kill_group(proc)

    def stop_server(self, port: int) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                try:
                    self._proc.stdin.write(b"stop %d\n" % port)
                except OSError:
                    pass

    def stop(self) -> None:
        with self._lock:
            proc, self._proc, self._ready, self._pending = self._proc, None, False, b""
        if proc is None:
            return
        try:
            proc.stdin.close()      # EOF: the child ends by itself
            proc.wait(2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if proc.poll() is None:
            kill_group(proc)
        else:
            proc.stdout.close()


# --------------------------------------------------------------------------------------------------------------------
# the child

def _prctl(option: int, arg: int) -> None:
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def _drop_privileges(parent: int) -> None:
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if os.geteuid() == 0:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
        for cap in range(last + 1):
            _prctl(_PR_CAPBSET_DROP, cap)
        uid = random.randrange(*UID_RANGE)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    # a change of credentials clears the parent-death signal: set it again, and check the parent is still there
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:
        os._exit(1)


def _warm_up(start, stop) -> None:
    """Import and initialise, while privileged, what serving will need (the uid may not read the virtualenv)."""
    import redis
    server = start()
    try:
        with redis.Redis(port=server.port, socket_timeout=10) as client:
            client.eval("return redis.call('SET', KEYS[1], ARGV[1])", 1, "k", "v")
            client.function_load("#!lua name=warm\nredis.register_function('warm', function() return 1 end)")
            client.fcall("warm", 0)
            client.rpush("q", "x")
            client.blpop(["q"], timeout=1)
            client.xadd("s", {"f": "v"})
            with client.pipeline(transaction=True) as pipe:
                pipe.incr("n").get("n").execute()
    finally:
        stop(server)


def main() -> None:
    parent = os.getppid()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                       # anything printed by libraries goes to stderr, not into the protocol
    threading.stack_size(THREAD_STACK)
    from retrylab.brokers.redis.fakeredis_fixes import start_fake_server, stop_fake_server
    _warm_up(start_fake_server, stop_fake_server)
    _drop_privileges(parent)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    servers = {}
    print("ready", file=out, flush=True)
    for line in sys.stdin:
        words = line.split()
        if words == ["new"]:
            server = start_fake_server()
            servers[server.port] = server
            print(server.port, file=out, flush=True)
        elif len(words) == 2 and words[0] == "stop" and words[1].isdigit():
            server = servers.pop(int(words[1]), None)
            if server is not None:
                threading.Thread(target=stop_fake_server, args=(server,), daemon=True).start()
    os._exit(0)


if __name__ == "__main__":
    main()
