"""Run learner scripts as contained subprocesses in a throw-away copy of the submission.

A learner's script is untrusted: it may hang, print without end, eat memory, fork, or scribble
over files. Each run gets a fresh copy of the submission as cwd, an environment built from an
allowlist, resource limits, output read concurrently into a bounded buffer, and a hard time
limit after which its whole process group is killed.
"""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


SITE_DIR = Path(__file__).resolve().parent / "learner_site" / "pythonpath"
if not (SITE_DIR / "sitecustomize.py").is_file():
    # Without it a learner's script would reach whatever Redis it names (e.g. a shared :6379).
    raise ImportError(f"retrylab is installed without its learner site ({SITE_DIR}/sitecustomize.py)")
_ENV_ALLOWLIST = ("PATH", "LANG", "LANGUAGE", "TERM")


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 1 << 30          # address space
    file_bytes: int = 256 << 20          # largest file a script may write
    cpu_seconds: int = 60
    output_bytes: int = 64 << 10         # kept of each stream: the first and last halves


class CappedBuffer:
    """Keeps the first and last `limit/2` bytes of a stream and counts what was dropped between."""

    def __init__(self, limit: int):
        self._half = max(1, limit // 2)
        self._head = bytearray()
        self._tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self._half - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            excess = len(self._tail) - self._half
            if excess > 0:
                del self._tail[:excess]
                self.dropped += excess

    def text(self) -> str:
        middle = f"\n[... {self.dropped} bytes not shown ...]\n" if self.dropped else ""
        return (bytes(self._head).decode("utf-8", "replace") + middle
                + bytes(self._tail).decode("utf-8", "replace"))


@dataclass(frozen=True)
class ScriptResult:
    script: str
    returncode: int | None      # None: it did not exit by itself
    stopped: str | None         # None (exited), "settled" (harness stopped it, normal), "timeout"
    stdout: str
    stderr: str
    seconds: float

    @property
    def crashed(self) -> bool:
        return self.stopped is None and self.returncode not in (0, None)

    def describe(self) -> str:
        if self.stopped == "timeout":
            return f"{self.script} was still running after {self.seconds:.0f} s and was stopped"
        if self.stopped == "settled":
            return f"{self.script} kept running after its work was done and was stopped (that is fine)"
        if self.returncode is not None and self.returncode < 0:
            name = signal.Signals(-self.returncode).name if -self.returncode in signal.Signals._value2member_map_ else self.returncode
            return f"{self.script} was killed by {name}"
        return f"{self.script} exited with status {self.returncode}"

    def stderr_tail(self, lines: int = 12) -> str:
        tail = self.stderr.strip().splitlines()[-lines:]
        return "\n".join(tail)


class Sandbox:
    """A temporary copy of a submission, removed on exit, where scripts run."""

    def __init__(self, submission: Path, limits: Limits = Limits()):
        self.submission = Path(submission)
        self.limits = limits
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.root: Path | None = None

    def __enter__(self) -> "Sandbox":
        self._tmp = tempfile.TemporaryDirectory(prefix="retrylab-run-")
        self.root = Path(self._tmp.name)
        self.workdir = self.root / "submission"
        self.home = self.root / "home"
        self.home.mkdir()
        # symlinks stay links: a link to a harness file must not be copied in as the file itself
        shutil.copytree(self.submission, self.workdir, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", ".git"))
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def has(self, script: str) -> bool:
        return (self.workdir / script).is_file()

    def environment(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in _ENV_ALLOWLIST or k.startswith("LC_")}
        env.update(HOME=str(self.home), TZ="UTC", PYTHONPATH=str(SITE_DIR),
                   PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8",
                   RETRYLAB_SITE_ACTIVE="1")
        env.setdefault("PATH", os.defpath)
        env.update(extra)
        return env

    def run(self, script: str, *, env: dict[str, str], timeout: float,
            stop_when: Callable[[], bool] | None = None, poll: float = 0.02) -> ScriptResult:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, script], cwd=self.workdir, env=self.environment(env),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        self._limit(proc.pid)
        out, err = CappedBuffer(self.limits.output_bytes), CappedBuffer(self.limits.output_bytes)
        readers = [_drain(proc.stdout, out), _drain(proc.stderr, err)]
        stopped = None
        while proc.poll() is None:
            if time.monotonic() - started > timeout:
                stopped = "timeout"
                break
            if stop_when is not None and stop_when():
                stopped = "settled"
                break
            time.sleep(poll)
        if stopped:
            _kill_group(proc)
        else:
            _kill_group(proc, grace=0)  # the script exited; anything it left behind goes too
        for reader in readers:
            reader.join(timeout=2)
        return ScriptResult(script=script, returncode=None if stopped else proc.returncode,
                            stopped=stopped, stdout=out.text(), stderr=err.text(),
                            seconds=time.monotonic() - started)

    def _limit(self, pid: int) -> None:
        # Set from the parent right after the fork/exec rather than in preexec_fn, which is unsafe
        # in a threaded harness; the learner's code cannot run before the interpreter has started.
        limits = {resource.RLIMIT_AS: self.limits.memory_bytes,
                  resource.RLIMIT_FSIZE: self.limits.file_bytes,
                  resource.RLIMIT_CPU: self.limits.cpu_seconds,
                  resource.RLIMIT_CORE: 0}
        for which, value in limits.items():
            try:
                resource.prlimit(pid, which, (value, value))
            except (ProcessLookupError, PermissionError, ValueError):
                pass


def _drain(stream, buffer: CappedBuffer) -> threading.Thread:
    def pump():
        with stream:
            while chunk := stream.read1(65536):
                buffer.feed(chunk)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def _kill_group(proc: subprocess.Popen, grace: float = 0.5) -> None:
    """SIGTERM the script's process group, then SIGKILL whatever is left after `grace` seconds."""
    if grace:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
