"""Warm grading processes for `grade-batch`: the imports and the containment probe done once, each
submission still graded in a process of its own.

A cold grading process spends most of a second before it grades anything: the interpreter, pytest,
the harness, the broker's client and server libraries, and the probe that measures what containment
the machine allows (a learner process started in each way). A warm process (`python -m
retrylab.gradeworker EXERCISE BACKEND LANG`) does all that once, then forks one child per submission; the child
is what `python -m retrylab.batch` would be (its own session and process group, its own private
servers and sandboxes, the same report file), started in a few milliseconds. Nothing of one grading
is seen by the next: each is a fresh fork of the warm process, which itself never grades.

The protocol, one line each way per grading, on the warm process's stdin and stdout:
  batch -> warm:   {"argv": [...python -m retrylab.batch's arguments...], "stderr": "/path"}
  warm  -> batch:  "started PID", then "ended STATUS" (as subprocess's returncode: -N for signal N)
Before the first request the warm process says "ready" (or exits: the batch then grades cold).

The warm process is single-threaded when it forks (checked: forking a process with threads can leave
a lock held forever in the child), replaced after WARM_GRADINGS gradings, and ends when its stdin
closes.
"""
from __future__ import annotations

import atexit
import importlib
import contextlib
import fcntl
import json
import os
import random
import resource
import select
import signal
import subprocess
import sys
import threading
import time
import traceback

from retrylab import i18n, procfs

WARM_GRADINGS = 50      # gradings forked from one warm process before a fresh one replaces it
READ_SLICE = 0.5        # seconds a wait holds the line reader, so another thread can stop the grading
ROOM_FOR_DESCRIPTORS = 1024   # descriptors a forked grading's table holds from the start (_room_for_descriptors)


class WarmUnavailable(Exception):
    """The warm process did not start, or stopped answering: grade cold instead."""


# -- the batch's side ----------------------------------------------------------------------------------

class WarmWorker:
    """One warm process, used by one batch thread at a time."""

    def __init__(self, exercise_id: str, backend: str, start_limit: float, lang: str = i18n.DEFAULT):
        self.gradings = 0
        self.broken = False
        self._buffer = b""
        self._proc = subprocess.Popen([sys.executable, "-m", "retrylab.gradeworker", exercise_id, backend, lang],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
        try:
            ready = self._line(start_limit)
        except TimeoutError:
            ready = ""
        if ready != "ready":
            self.close()
            raise WarmUnavailable("the warm grading process did not start")

    @property
    def worn(self) -> bool:
        return self.broken or self.gradings >= WARM_GRADINGS or self._proc.poll() is not None

    def start(self, argv: list[str], stderr_path: str, start_limit: float) -> "ForkedGrading":
        """Fork a grading of `argv` (python -m retrylab.batch's arguments); its stderr goes to the file."""
        self.gradings += 1
        try:
            self._proc.stdin.write(json.dumps({"argv": argv, "stderr": stderr_path}).encode() + b"\n")
            self._proc.stdin.flush()
            answer = self._line(start_limit)
        except (OSError, TimeoutError):
            answer = ""
        if not answer.startswith("started "):
            self.broken = True
            self.close()
            raise WarmUnavailable(f"the warm grading process answered {answer!r}")
        return ForkedGrading(self, int(answer.split()[1]))

    def close(self) -> None:
        """End the warm process (a grading it forked is not its child's business: it has its own group)."""
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _line(self, timeout: float | None) -> str:
        """The next line the warm process wrote; "" at its end; TimeoutError when none came in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError
            if not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(fd, 4096)
            if not chunk:
                return ""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode("ascii", "replace").strip()


class ForkedGrading:
    """A grading forked by a warm process: what `subprocess.Popen` offers the batch (pid, wait,
    returncode). Its parent is the warm process, which says when it ended and how."""

    def __init__(self, worker: WarmWorker, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._worker = worker
        self._lock = threading.Lock()   # one reader of the warm process's answers at a time

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(f"grading {self.pid}", timeout)
            if not self._lock.acquire(timeout=-1 if remaining is None else remaining):
                continue
            try:
                if self.returncode is None:
                    self._read_end(READ_SLICE if remaining is None else min(READ_SLICE, remaining))
            finally:
                self._lock.release()
        return self.returncode

    def _read_end(self, timeout: float) -> None:
        try:
            line = self._worker._line(timeout)
        except TimeoutError:
            return
        if line.startswith("ended "):
            self.returncode = int(line.split()[1])
            return
        # the warm process died under its grading (or said something else): stop the grading's group
        self._worker.broken = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.returncode = -signal.SIGKILL


class WarmPool:
    """A warm process per batch thread, made when the thread first grades and replaced when worn; when
    one cannot be made, that thread grades cold from then on."""

    def __init__(self, exercise_id: str, backend: str, start_limit: float, lang: str = i18n.DEFAULT):
        self._exercise_id, self._backend, self._lang = exercise_id, backend, lang
        self._start_limit = start_limit
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[WarmWorker] = []

    def worker(self) -> WarmWorker | None:
        current = getattr(self._local, "worker", None)
        if current is not None and not current.worn:
            return current
        if current is not None:
            current.close()
        if getattr(self._local, "cold", False):
            return None
        try:
            current = WarmWorker(self._exercise_id, self._backend, self._start_limit, self._lang)
        except (WarmUnavailable, OSError):     # it did not come up, or could not be started
            self._local.cold, current = True, None
        self._local.worker = current
        if current is not None:
            with self._lock:
                self._all.append(current)
        return current

    def close(self) -> None:
        with self._lock:
            workers, self._all = self._all, []
        for worker in workers:
            worker.close()


# -- the warm process ----------------------------------------------------------------------------------

def _warm_up(exercise_id: str, backend: str, lang: str = i18n.DEFAULT) -> None:
    """Import what every grading imports (the modules of the backend's servers too, where they fork from the
    grading, else look for what spawning them uses), measure the containment, start the learner template and read
    the message catalogs once; the forks inherit all of it."""
    grading = importlib.import_module("retrylab.grading")    # pytest, the plugin, the reporters
    importlib.import_module("retrylab.batch")                 # what a forked grading runs (batch.child_main)
    from retrylab import brokers, plugin, sandbox, spawn, warmstart
    from retrylab import exercise as exercises
    exercise = exercises.get(exercise_id)
    if not brokers.prepare_to_fork_servers(exercise.broker, backend):
        spawn.prepare()         # the gradings spawn their servers: setpriv looked for once, here
    imports = plugin.learner_imports(exercise)
    if warmstart.enabled() and sandbox.containment(imports).namespaces != "bwrap":
        # one learner template for all the gradings forked from here (they come one at a time), not one each
        warmstart.template(plugin.warm_imports(exercise), sandbox.Sandbox.template_environment())
        warmstart.share_with_forks()
    grading.collect(exercise)   # the checks, their fixtures' modules and the broker's libraries, imported once
    i18n.exercise_catalog(exercise)
    i18n.preload((lang,))       # the engine's, the exercise's and its checks' messages, in the batch's language


def _graded_child(request: dict) -> None:
    """In the forked child: become `python -m retrylab.batch ARGV`, then exit without returning."""
    code = 1
    try:
        os.setsid()                     # a group of its own, as the cold grading's start_new_session
        _room_for_descriptors()
        atexit._clear()                 # the warm process's exit handlers are not this grading's
        random.seed()                   # not the warm process's sequence, shared by every fork
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(err, 2)
        os.close(null)
        os.close(err)
        from retrylab.batch import child_main
        code = child_main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the report of a harness defect goes to the grading's stderr
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _room_for_descriptors(count: int = ROOM_FOR_DESCRIPTORS) -> None:
    """Grow this process's descriptor table now, while it has a single thread. A forked child's table is only as
    large as its highest open descriptor needs; a process with threads that outgrows it waits for an RCU grace
    period (10-20 ms here) in the thread that opens the descriptor: a relay's, or the main one mid-check."""
    high = min(count, resource.getrlimit(resource.RLIMIT_NOFILE)[0]) - 1
    if high > 2:
        with contextlib.suppress(OSError):      # without it the table still grows when needed, only slower
            os.close(fcntl.fcntl(0, fcntl.F_DUPFD, high))   # the lowest free number from `high` up: none replaced


def _say(text: str) -> None:
    os.write(1, text.encode() + b"\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the batch stops its gradings itself, then closes stdin
    try:
        _warm_up(*argv[:3])
    except Exception:  # noqa: BLE001 - no "ready": the batch grades cold, and that grading says what is wrong
        return 1
    if procfs.own_threads() != 1:                  # a fork would inherit locks held by other threads
        return 1
    _say("ready")
    for _ in range(WARM_GRADINGS):
        line = sys.stdin.buffer.readline()
        if not line:
            return 0
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _graded_child(request)
        _say(f"started {pid}")
        _, status = os.waitpid(pid, 0)
        _say(f"ended {os.waitstatus_to_exitcode(status)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
