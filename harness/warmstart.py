"""The harness's end of the warm learner template (retrylab.learner_template): start it, have it fork runs.

One template per grading process and set of learner imports, started on first use (or ahead, sandbox.prepare) with the
environment every learner process starts with, and ended with the process (its socket closes). A run it forks
is handled like the supervisor `subprocess.Popen` gives a cold run (`WarmProcess`: the same pid, pipes, signals
and waits, through a pidfd since the template, not the harness, is its parent).

RETRYLAB_WARM_START=0 turns it off (every run starts two cold interpreters, and bubblewrap is preferred again).
A template that cannot start, or dies, is a harness problem (SandboxError), never the learner's; the next run
starts a new one.
"""
from __future__ import annotations

import atexit
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from retrylab import learner_template
WARM_VARIABLE = "RETRYLAB_WARM_START"
READY_TIMEOUT = 30.0        # seconds for a template to import the learner side (a loaded machine)
ANSWER_TIMEOUT = 10.0       # seconds for it to fork a run
_BOOT = "import sys; from retrylab.learner_template import serve; serve(int(sys.argv[1]), sys.argv[2:])"
# besides the broker's client libraries and the engine's: what nearly every learner script imports
_COMMON_IMPORTS = ("json", "logging")


class TemplateError(RuntimeError):
    """The template could not be started or did not answer."""


def enabled() -> bool:
    return os.environ.get(WARM_VARIABLE, "1").strip() != "0" and hasattr(os, "pidfd_open")


class WarmProcess:
    """A run's supervisor forked by the template: what sandbox.Sandbox.run uses of a Popen. It holds the
    write end of the run's lifeline: when this process goes (killed included), the supervisor stops the run,
    as a cold supervisor does when its parent dies."""

    def __init__(self, pid: int, pidfd: int, stdout, stderr, lifeline: int):
        self.pid, self._pidfd, self._lifeline = pid, pidfd, lifeline
        self.stdout, self.stderr = stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("supervisor", timeout)
            self._ended()
        return self.returncode

    def _ended(self) -> None:
        self.returncode = 0     # its exit status is the template's to reap; the run's report says how it went
        self._close()

    def _close(self) -> None:
        for name in ("_pidfd", "_lifeline"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                setattr(self, name, -1)
                os.close(fd)

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        try:
            self.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __del__(self):
        self._close()


class Template:
    """A running template and the socket to it. Usable from several threads; after a fork, from the child
    alone (`share_with_forks`), since requests and answers are matched by id, not by order."""

    def __init__(self, imports: tuple[str, ...], env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(theirs.fileno()), *imports],
                env={**env, "RETRYLAB_ROOM": " " * learner_template.ROOM}, cwd="/",
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.pid, self._proc, self._socket, self._starter = proc.pid, proc, ours, os.getpid()
        self._pidfd = os.pidfd_open(proc.pid)   # alive? asked in forks too, where Popen cannot wait for it
        self._lock = threading.Lock()
        try:
            if self._answer(b"ready", READY_TIMEOUT)[0] != b"ready":
                raise TemplateError("the learner template did not start")
        except BaseException:
            self.close()
            raise

    def alive(self) -> bool:
        return self._pidfd >= 0 and not select.select([self._pidfd], [], [], 0)[0]

    def _answer(self, request: bytes, timeout: float) -> tuple[bytes, list[int]]:
        """The answer to `request` (its first 8 bytes); an answer to an earlier request, left by a process that
        was killed while waiting for it, is dropped."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._socket], [], [], left)[0]:
                raise TemplateError(f"the learner template did not answer in {timeout:.0f} s")
            message, fds, _, _ = socket.recv_fds(self._socket, 64, 1)
            if not message:
                raise TemplateError("the learner template ended")
            if message[:8] == request[:8]:
                return message[8:] if request != b"ready" else message, fds
            for fd in fds:
                os.close(fd)

    def fork_run(self, status_w: int, config_r: int) -> WarmProcess:
        """A new supervisor, reading its config from `config_r` and reporting on `status_w`, its stdout and
        stderr on fresh pipes."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        life_r, life_w = os.pipe()
        request = os.urandom(8)
        try:
            with self._lock:
                socket.send_fds(self._socket, [b"run" + request], [out_w, err_w, status_w, config_r, life_r])
                message, fds = self._answer(request, ANSWER_TIMEOUT)
            if len(message) != 4 or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise TemplateError("the learner template answered nonsense")
        except BaseException as exc:   # Ctrl-C while waiting too: closing the lifeline stops a supervisor forked anyway
            for fd in (out_r, err_r, life_w):
                os.close(fd)
            if isinstance(exc, (OSError, TemplateError)):
                self.close()
            raise
        finally:
            for fd in (out_w, err_w, life_r):
                os.close(fd)
        return WarmProcess(int.from_bytes(message, "little"), fds[0], open(out_r, "rb"), open(err_r, "rb"), life_w)

    def close(self) -> None:
        """Close the socket: the template ends once no process holds it any more."""
        self._socket.close()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        if os.getpid() == self._starter:  # its parent: reap it
            try:
                self._proc.wait(2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


_templates: dict[tuple[str, ...], Template] = {}
_lock = threading.Lock()
_shared = False


def template(imports: tuple[str, ...], env: dict[str, str]) -> Template:
    """The live template of this process for these imports (started now if there is none)."""
    with _lock:
        current = _templates.get(imports)
        if current is None or not current.alive():
            if current is not None:
                current.close()
            current = _templates[imports] = Template((*imports, *_COMMON_IMPORTS), env)
        return current


@atexit.register
def _close_at_exit() -> None:
    """End and reap the templates this process started: one left to end by itself once we are gone would be
    reaped by init, and the CPU of every learner run it forked would go uncounted by whoever timed us (`time`,
    a benchmark, a grading service's accounting)."""
    for current in list(_templates.values()):
        if current._starter == os.getpid():
            current.close()


def share_with_forks() -> None:
    """Let a process forked from this one use this one's templates (grade-batch's warm processes: each forks
    one grading at a time and waits). Otherwise a fork starts templates of its own."""
    global _shared
    _shared = True


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()            # another thread may have held it at the fork
    if not _shared:
        _templates.clear()              # the sockets stay open for the parent; this copy never uses them
    for current in _templates.values():
        current._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
