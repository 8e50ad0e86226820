"""Private server processes (a broker's fake server, its real server process, ...) that die with the grading.

Each gets its own process group (a terminal's Ctrl-C reaches the grading, which stops them in order) and,
on Linux, the parent-death signal. The kernel sends that signal when the *thread* that forked the child
ends, so every server is forked from one long-lived thread: a check run on a worker thread that ends must
not take the server it started (and later checks reuse) with it.

The signal is set in the child after fork, after its change of uid (which would clear it) and before exec: by
util-linux's setpriv, which the child execs first, then a shell that checks the grading is still its parent and
execs the server (same pid, same process group). No Python code runs in the child. A preexec_fn did this before,
and made the child run the interpreter's after-fork code, which in CPython before 3.12 can wait for ever on a lock
another thread held at the fork (cpython gh-112275: a thread state made or deleted at that moment, e.g. by a
C library's thread calling into Python); a CI run hung on it starting a Tansu broker. Where setpriv is missing, the
preexec_fn is still used.

That thread is a daemon: an interpreter that is exiting (a Ctrl-C in `retrylab watch`) never waits for it.
concurrent.futures' pool threads are not daemons and are joined at exit only if their registration
finished; a KeyboardInterrupt between a pool thread's start and its registration left one the exit waited
on for ever (`watch` hung after Ctrl-C in CI).
"""
from __future__ import annotations

import concurrent.futures
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading

from retrylab.confine import libc

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_SERVER_UIDS = (2_140_000_000, 2_147_000_000)   # private servers' uids as root: never a real user's, nor a learner's


def _die_with_parent(prctl, parent: int) -> None:
    """In the forked child, before exec (and after any change of uid, which would clear it): be killed when the
    grading's spawning thread ends, and stop if the grading is already gone (it may have died between fork and
    before this ran; gain no privileges by exec. `prctl` is resolved in the parent: nothing is imported after fork."""
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


# In the child, after setpriv: $0 is the grading's pid; a child whose parent is already another (the grading died
# before setpriv set the signal) stops instead of running on unowned
_CHECK_PARENT = '[ "$PPID" = "$0" ] || exit 1; exec "$@"'


_setpriv_found: list[tuple[str, str] | None] = []     # the answer, once there is one that lasts


def _setpriv() -> tuple[str, str] | None:
    """setpriv (util-linux 2.33 or newer) and a POSIX shell, where both are here. Looked for once per process (and
    inherited by forks); a look that failed for a transient reason (out of processes, a timeout) is not kept: the
    fallback it leads to is the preexec_fn that this module avoids where it can."""
    if _setpriv_found:
        return _setpriv_found[0]
    setpriv, shell = shutil.which("setpriv"), "/bin/sh"
    if setpriv is None or not os.access(shell, os.X_OK):
        found = None
    else:
        try:
            usage = subprocess.run([setpriv, "--help"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        found = (setpriv, shell) if "--pdeathsig" in usage else None
    _setpriv_found.append(found)
    return found


def prepare() -> None:
    """Look for setpriv now (about 3 ms, once per process): grade-batch's warm process does, so that the gradings
    it forks inherit the answer instead of each looking again before its first server."""
    _setpriv()


def _with_parent_death_signal(argv: list[str], parent: int) -> list[str] | None:
    """`argv` run so that it is killed when the spawning thread ends, with no new privileges; None without setpriv."""
    tools = _setpriv()
    if tools is None:
        return None
    setpriv, shell = tools
    return [setpriv, "--pdeathsig", "KILL", "--no-new-privs", "--", shell, "-c", _CHECK_PARENT, str(parent), *argv]


def server_uid() -> int | None:
    """As root, a fresh unprivileged uid (and gid) for a private server; None otherwise."""
    return random.randrange(*_SERVER_UIDS) if os.geteuid() == 0 else None


class _Spawner:
    """One daemon thread that forks every private server, handed work through a queue."""

    def __init__(self):
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, function, *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="retrylab-server-spawner", daemon=True)
                self._thread.start()
        self._work.put((future, function, args, kwargs))
        return future

    def _serve(self) -> None:
        while True:
            future, function, args, kwargs = self._work.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(function(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)


_spawner = _Spawner()


def _kill_when_made(future: concurrent.futures.Future) -> None:
    """The caller stopped waiting (Ctrl-C): the process it asked for is nobody's, so it goes as soon as it exists."""
    if future.cancelled() or future.exception() is not None:
        return
    kill_group(future.result())


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a server started here (its whole process group) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def spawn_server(argv: list[str], **popen_kwargs) -> subprocess.Popen:
    """Start a private server process that dies with the grading (see the module's text)."""
    if not sys.platform.startswith("linux"):
        return subprocess.Popen(argv, start_new_session=True, **popen_kwargs)
    parent = os.getpid()
    wrapped = _with_parent_death_signal(argv, parent)
    if wrapped is not None:
        future = _spawner.submit(subprocess.Popen, wrapped, start_new_session=True, **popen_kwargs)
    else:
        prctl = libc().prctl
        future = _spawner.submit(subprocess.Popen, argv, start_new_session=True,
                                 preexec_fn=lambda: _die_with_parent(prctl, parent), **popen_kwargs)
    try:
        return future.result()
    except BaseException:
        if not future.cancel():
            future.add_done_callback(_kill_when_made)
        raise
