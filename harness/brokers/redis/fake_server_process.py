"""The fake backend's servers, out of the grading process: one child process per grading hands out a fresh
PatchedTcpFakeServer (on a new port) for every private Redis.

Why a child: the fake server runs whatever a learner's script sends it, EVAL included. In the grading process a
flaw in fakeredis (or its Lua bridge) would be a flaw in the grader; in a child it reaches an unprivileged process
that holds nothing but fake Redis data. The child is forked from the grading when the grading has imported
fakeredis and has a single thread (`retrylab check` and grade-batch's gradings arrange both: ForkedServer), else
started as an interpreter (retrylab.spawn.spawn_server); either way it is in a session of its own, killed when the
grading dies, imports everything it needs and warms fakeredis' Lua up while still privileged, then, as root, drops
to a fresh unprivileged uid with no capabilities and no_new_privs, and bounds its own memory. One process per
grading keeps the cost to one fork (or one interpreter start, ~0.3 s, overlapped with the grading's own start); a
fresh server per private Redis keeps DESIGN's guarantee that no state, and no killed client's ghost BLPOP, carries
from one check to the next.

Protocol, text lines on the child's stdin and stdout: the parent writes `new`, the child answers with the new
server's port; the parent writes `stop <port>`, nothing is answered (the server stops in the background). The child
writes `ready` once it serves. EOF on stdin (the grading went away) ends it.
"""
from __future__ import annotations

import gc
import os
import random
import resource
import select
import signal
import subprocess
import sys
import threading
import time
import warnings

from retrylab import procfs
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
        # only the first child may be forked: one started again mid-grading (the last one ended: a learner's memory
        # bomb, an exchange cut short) would copy the whole grading, its heap and pending garbage included
        self._may_fork = True

    def start(self) -> FakeServerProcess:
        may_fork, self._may_fork = self._may_fork, False
        if may_fork and _warm_here():
            proc = ForkedServer.fork()
        else:
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
                try:
                    self._proc.stdin.write(b"new\n")
                except OSError:     # BrokenPipeError: it ended since its last answer
                    raise BackendUnavailable("the fake Redis server process ended (exit status "
                                             f"{self._proc.poll()}); try --backend redis-server") from None
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
# a child forked from a warm grading process

def _warm_here() -> bool:
    """Fork the server rather than start a new interpreter: fakeredis is imported here already
    (brokers.prepare_to_fork_servers: grade-batch's warm processes and `retrylab check` import it ahead, about 0.2-0.3
    CPU-s less a grading), and this process has a single thread now (a fork copies only the calling thread: a lock
    another thread held would stay held)."""
    from retrylab import warmstart      # RETRYLAB_WARM_START=0 turns forking off here too
    from retrylab.brokers.redis import BROKER
    return (all(name in sys.modules for name in BROKER.grading_warm_imports) and procfs.own_threads() == 1
            and warmstart.enabled())


class ForkedServer:
    """What FakeServerProcess uses of a Popen, for a server forked from this process. As a spawned one, it is in
    a session of its own, killed by the kernel when this process ends (parent-death signal), talks over its stdin
    and stdout, drops its privileges before serving, and holds no descriptor of ours but those two pipes."""

    stderr = None

    def __init__(self, pid: int, stdin, stdout):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None

    @classmethod
    def fork(cls) -> ForkedServer:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl     # resolved here: nothing is imported after the fork
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        parent = os.getpid()
        # Ctrl-C or SIGTERM held until both sides are set: the child must not run the grading's handlers (they
        # would unwind the grading's stack in it), nor the parent leave a child no one owns
        interrupts = {signal.SIGINT, signal.SIGTERM}
        held = signal.pthread_sigmask(signal.SIG_BLOCK, interrupts)
        try:
            pid = os.fork()
            if pid == 0:                                     # the server: never returns
                cls._serve_forked(parent, prctl, held, in_r, out_w)
            os.close(in_r)
            os.close(out_w)
            return cls(pid, os.fdopen(in_w, "wb", 0), os.fdopen(out_r, "rb", 0))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    @staticmethod
    def _serve_forked(parent: int, prctl, held, in_r: int, out_w: int) -> None:
        """The forked child: serve until the grading's pipe closes, then leave without running anything of the
        grading's (os._exit: no atexit handler, no stdio buffer flushed twice)."""
        code = 1
        try:
            # nothing inherited is ever collected: a cyclic garbage file object of the grading's, finalised here,
            # would close a descriptor number the server has reused since closerange below
            gc.freeze()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()                                      # out of the terminal's process group: no Ctrl-C here
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            # the spawned server runs `python -I`; this one has the grading's interpreter state: a warning filter
            # turned into errors (-W error, PYTHONWARNINGS) must not become error replies to a learner's script
            warnings.simplefilter("ignore")
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)
            # ignored, as in any Python process: a client gone mid-reply (a learner's process killed) is an error
            # on that connection; the default action killed the server and every later check of the grading
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(devnull, 2)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            serve(parent, os.fdopen(0, "r"))
            code = 0
        finally:
            os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status, as soon as it has ended: its pidfd wakes the wait (every grading waits for its server
        to end; a 10 ms poll made that a few ms longer). Polled where the kernel gives no pidfd."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pidfd = _pidfd(self.pid) if self.poll() is None else None
        try:
            while self.poll() is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise subprocess.TimeoutExpired("fake Redis server", timeout)
                if pidfd is None:
                    time.sleep(0.01)
                else:
                    select.select([pidfd], [], [], remaining)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):   # no pidfd here (an old kernel), or the process is gone
        return None


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
    serve(os.getppid(), sys.stdin)
    os._exit(0)


def serve(parent: int, requests) -> None:
    """Answer the grading's requests (lines of `requests`, the stdin pipe) on stdout until it closes."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                       # anything printed by libraries goes to stderr, not into the protocol
    threading.stack_size(THREAD_STACK)
    from retrylab.brokers.redis.fakeredis_fixes import start_fake_server, stop_fake_server
    _warm_up(start_fake_server, stop_fake_server)
    _drop_privileges(parent)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    servers = {}
    print("ready", file=out, flush=True)
    for line in requests:
        words = line.split()
        if words == ["new"]:
            server = start_fake_server()
            servers[server.port] = server
            print(server.port, file=out, flush=True)
        elif len(words) == 2 and words[0] == "stop" and words[1].isdigit():
            server = servers.pop(int(words[1]), None)
            if server is not None:
                threading.Thread(target=stop_fake_server, args=(server,), daemon=True).start()


if __name__ == "__main__":
    main()
