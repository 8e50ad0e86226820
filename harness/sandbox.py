"""Run learner scripts as contained subprocesses in a throw-away copy of the submission.

A learner's script is untrusted: it may hang, print without end, eat memory, fork without end,
leave a daemon behind, ignore SIGTERM, read the environment, or scribble over files. Each run gets
a fresh copy of the submission as cwd, an environment built from an allowlist, resource limits,
output read concurrently into bounded buffers, and a hard time limit. How it is contained depends
on what the machine allows (`containment()` says what applies here):

- A supervisor process (supervisor.py) sits between the harness and the script. It is
  a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so whatever the script starts, even a daemon
  that double-forks and calls setsid, stays its descendant. When the script exits, or the harness
  stops it (SIGTERM, then SIGKILL after a grace period), the supervisor kills every descendant and
  reports how the script ended and which limits it hit.
- As root, the script runs as a fresh unprivileged uid (one per run), with no capabilities and
  no_new_privs: RLIMIT_NPROC then bounds its processes, it cannot write the harness's files nor the
  original submission, nor read another process's environment, and a kill(-1) from that uid ends
  everything it started.
  Directories that other users cannot enter on the way to the interpreter (a pyenv under /root)
  are exposed, alone, in a private mount namespace. Where that does not work, the script runs as
  root without capabilities (it cannot raise its limits or read the harness's environment).
- Without a uid of its own, a pids cgroup (v2, or v1's pids hierarchy) bounds the processes where
  one can be made, and says when the bound was hit; as root without either, the supervisor counts
  them itself. Not root (a learner's own machine): RLIMIT_NPROC above the tasks the user runs.
- Namespaces (`Containment.namespaces`): each script has its own mount, network, IPC, PID and UTS
  namespaces, through bubblewrap where it is installed, else unshare(2) directly (supervisor.py
  carries out the same mount plan either way, retrylab.mountplan). It sees the system read-only, what
  Python needs, its run's folder at the same path, private /tmp, /var/tmp, /run/lock, /dev/shm, a
  fresh /proc; no network: the harness's unix sockets for it live in `Sandbox.socket_dir`
  (root/"sock", the harness's, 0755), which it sees at the same path. Where neither works, isolation
  is partial (`Containment.isolated` is False): the report says so, `--isolation required` refuses.
- Resource limits: memory (the run's processes together, counted by the supervisor; each one's private data by
  RLIMIT_DATA, its address space more loosely), CPU time, file size, open files, no core dumps; where the
  harness may mount, all the run writes in its folder (a tmpfs of its own, retrylab.runfs). Hitting one is named
  in `ScriptResult.describe()` ("consumer.py was stopped: it exceeded the 1 GiB memory limit"), in the language
  current when the script ran and when it is described (retrylab.i18n).

Warm start: the supervisor and the script are forked from the learner template (retrylab.warmstart, a process
that has imported the learner side once) rather than started as two cold interpreters, wherever the run is not
contained by bubblewrap; the containment is the same (retrylab.learner_template says how).

This module runs a script and reports on it; beside it, each with one job: containment (what this
machine allows), mountplan (the filesystem a script sees), runcopy (the copy of the submission and what
a run's uid leaves elsewhere), cgroups (a pids cgroup per run), procfs (what /proc says of processes),
supervisor and confine (the process between the harness and the script, and how its child contains
itself). What the learner's client libraries are (`learner_imports`, the broker's) is given, never named
here: the probe checks they import, and the mount plan shows where they are installed.
"""
from __future__ import annotations

import errno
import functools
import marshal
import os
import random
import re
import resource
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from retrylab import cgroups, containment_cache, i18n, procfs, runcopy, runfs, tempdirs, warmstart
from retrylab.containment import Containment, TransientProblem, detect
from retrylab.mountplan import ENGINE_IMPORTS, SITE_DIR, exposures, mount_plan, needed_paths
from retrylab.supervisor import KILL_BUDGET, STOP, STOP_NOW, kill
from retrylab.verdict import CheckFailed

__all__ = ["CappedBuffer", "Limits", "Sandbox", "SandboxError", "ScriptResult", "containment",
           "isolation_problem", "prepare", "sweep"]

_HARNESS_DIR = str(Path(__file__).resolve().parent)
# from supervisor.py's compiled file when there is one (a script would be compiled on every start)
_SUPERVISOR_CMD = ("import sys; sys.path.insert(0, {!r}); import supervisor; "
                   "supervisor.main(sys.argv)").format(_HARNESS_DIR)
_ENV_ALLOWLIST = ("PATH", "LANG", "LANGUAGE", "TERM")
RUN_ID_VARIABLE = "RETRYLAB_RUN_ID"     # in every learner process's environment: which run it belongs to
RUN_TAG_VARIABLE = "RETRYLAB_RUN_TAG"   # in the harness's environment: a prefix for run ids (tests)
STOP_GRACE = 0.5                        # seconds between SIGTERM and SIGKILL when a run is stopped
_UID_RANGE = (2_000_000_000, 2_100_000_000)  # uids for learner processes: one per run, never a real user


def _inherited_environment() -> dict[str, str]:
    """What a learner process takes from the grading's environment: the allowlist and the locale. The names are
    listed at once (one copy, atomic under the GIL) and only those kept are looked up: pytest sets and removes
    PYTEST_CURRENT_TEST around every phase of every check while runs beside the steps start here, and looking up
    every name listed could meet one just removed (a KeyError in the run's thread)."""
    env = {}
    for name in list(os.environ):
        if name in _ENV_ALLOWLIST or name.startswith("LC_"):
            value = os.environ.get(name)
            if value is not None:
                env[name] = value
    return env


class SandboxError(RuntimeError):
    """The harness could not run the learner's script at all (a harness or machine problem). `errno`: the system
    error behind it, where one was (raised here, or reported by the run's supervisor or init as "[Errno N]")."""

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno if errno is not None else _errno_in(message)


def _errno_in(text: str) -> int | None:
    """N of the first "[Errno N]" in `text`: how Python writes an OSError, as the run's processes report theirs."""
    found = re.search(r"\[Errno (\d+)\]", text)
    return int(found.group(1)) if found else None


RESERVED_PER_TASK = 72 << 20    # address space a thread reserves and mostly never writes: 8 MB of stack, 64 MB of arena


@dataclass(frozen=True)
class Limits:
    # memory a run's processes may hold together (the supervisor counts it: procfs.memory_below), and each one's
    # private memory (RLIMIT_DATA: heap, private mappings, thread stacks). The address space gets more
    # (address_space_bytes): glibc reserves a 64 MB malloc arena per thread, mostly never written, and under 1 GiB
    # of address space a process with a broker client's threads started about 16 (at 50 MB resident)
    memory_bytes: int = 1 << 30
    file_bytes: int = 256 << 20          # largest file a script may write
    disk_bytes: int = 512 << 20          # all a run may write in its folder, where it can be bounded (runfs)
    disk_files: int = 65536              # files and folders there, the same way
    cpu_seconds: int = 60
    output_bytes: int = 64 << 10         # kept of each stream: the first and last halves
    processes: int = 64                  # processes and threads the script may have at once
    open_files: int = 1024

    @property
    def address_space_bytes(self) -> int:
        """RLIMIT_AS: the memory limit, plus what each task may reserve without writing it (its stack and its malloc
        arena). It bounds what RLIMIT_DATA does not count: shared mappings."""
        return self.memory_bytes + self.processes * RESERVED_PER_TASK

    def phrase(self, limit: str) -> str:
        """How a learner is told which limit their script hit (in the current language)."""
        if limit == "memory":
            return i18n.label("limits.memory", size=_size(self.memory_bytes))
        if limit == "cpu":
            return i18n.label("limits.cpu", seconds=self.cpu_seconds)
        if limit == "file size":
            return i18n.label("limits.file_size", size=_size(self.file_bytes))
        if limit == "processes":
            return i18n.label("limits.processes", count=self.processes)
        if limit == "disk":
            return i18n.label("limits.disk", size=_size(self.disk_bytes), count=self.disk_files)
        raise KeyError(limit)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):  # unit symbols: the same in every language
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return i18n.label("limits.bytes", count=n)


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
        middle = f"\n{i18n.label('run.not_shown', count=self.dropped)}\n" if self.dropped else ""
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
    limit: str | None = None    # the resource limit it hit, as a learner reads it ("the 1 GiB memory limit"),
                                # in the language current when it ran
    peak_processes: int | None = None
    reason: str | None = None   # why the harness stopped it (a retrylab.settle.Reason value), if it did
    detail: str = ""            # what the stop condition saw, for the message (e.g. the read it waits in)
    cpu: float | None = None    # CPU seconds its processes had (None: not measured)
    broker: str = ""            # the broker's name as learners know it (from its link), for the messages

    @property
    def crashed(self) -> bool:
        return self.stopped is None and self.returncode not in (0, None)

    def describe(self) -> str:
        """How the script ended, for a learner, in the current language (i18n.use)."""
        facts = dict(script=self.script, limit=self.limit, seconds=self.seconds, broker=self.broker)
        if self.limit and (self.crashed or self.stopped == "timeout"):
            return i18n.label("run.limit_timeout" if self.stopped == "timeout" else "run.limit", **facts)
        if self.stopped == "timeout":
            text = i18n.label("run.timeout", **facts)
        elif self.stopped == "settled" and self.reason:
            text = i18n.label(f"run.stop.{self.reason}", detail=self.detail, **facts)
        elif self.stopped == "settled":
            text = i18n.label("run.settled", **facts)
        elif self.returncode is not None and self.returncode < 0:
            number = -self.returncode
            name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else self.returncode
            text = i18n.label("run.killed", signal=name, **facts)
        else:
            text = i18n.label("run.exited", status=self.returncode, **facts)
        return text + (i18n.label("run.reached", limit=self.limit) if self.limit else "")

    def stderr_tail(self, lines: int = 12) -> str:
        tail = self.stderr.strip().splitlines()[-lines:]
        return "\n".join(tail)


# --------------------------------------------------------------------------------------------------
# What containment this machine allows (measured once per harness process and set of client libraries,
# and kept a while across processes: containment_cache)

_detected: dict[tuple[str, ...], Containment] = {}
# A transient measurement (Containment.transient) serves only the process that made it, and only a while: every
# run of a grading asks, and a probe that timed out would otherwise be waited for again at each run. A process
# forked from it (grade-batch's warm one forks its gradings) measures for itself.
_transient: dict[tuple[str, ...], tuple[Containment, int, float]] = {}
TRANSIENT_KEPT = 60.0   # seconds
_detect_lock = threading.Lock()


def containment(learner_imports: tuple[str, ...] = ()) -> Containment:
    """The strongest containment that works on this machine for learner code that imports
    `learner_imports` (its broker's client libraries), measured on first use."""
    with _detect_lock:
        if learner_imports in _detected:
            return _detected[learner_imports]
        found, pid, when = _transient.get(learner_imports, (None, 0, 0.0))
        if found is not None and pid == os.getpid() and time.monotonic() - when < TRANSIENT_KEPT:
            return found
        measure = functools.partial(detect, functools.partial(_probe, learner_imports=learner_imports))
        found = containment_cache.cached(learner_imports, measure)
        if found.transient:
            _transient[learner_imports] = (found, os.getpid(), time.monotonic())
        else:
            _detected[learner_imports] = found
            _transient.pop(learner_imports, None)
        return found


def prepare(learner_imports: tuple[str, ...] = (), warm_imports: tuple[str, ...] = ()) -> None:
    """Get ready for the first run in the background, while the grading starts: measure the containment (or
    read it from the cache) and start the warm learner template (retrylab.warmstart) where runs will use it."""
    def ready():
        try:
            if warmstart.enabled() and containment(learner_imports).namespaces != "bwrap":
                warmstart.template(warm_imports, Sandbox.template_environment())
        except (OSError, SandboxError, warmstart.TemplateError):
            pass  # the first run tries again, and says why if it cannot run at all

    threading.Thread(target=ready, daemon=True, name="retrylab-prepare").start()


def isolation_problem(isolation: str, learner_imports: tuple[str, ...] = ()) -> str:
    """'' if learner code may run here under `isolation` ("auto": however the machine allows;
    "required": only in namespaces of its own), else the one line saying why not."""
    if isolation != "required" or containment(learner_imports).isolated:
        return ""
    why = "; ".join(n for n in containment(learner_imports).notes if "namespace" in n or "bwrap" in n)
    return (f"--isolation required: learner code cannot run in namespaces of its own here "
            f"({why or 'no bubblewrap and no unshare(2)'})")


# a machine out of processes, memory or descriptors for a moment: a probe failing so says nothing of the sandbox
_TRANSIENT_ERRNOS = (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.ENOSPC)


def _probe(candidate: Containment, learner_imports: tuple[str, ...]) -> str:
    """'' if a learner process runs with `candidate` and imports what the learner site needs (the
    engine's virtual clock and the broker's client libraries)."""
    script = f"import sys, {', '.join((*learner_imports, *ENGINE_IMPORTS))}\nprint(sys.version)\n"
    if candidate.namespaces:  # really in a PID namespace of its own
        script += "import os\nassert os.getpid() < 10, os.getpid()\n"
    folder = tempdirs.make("probe")
    try:
        Path(folder, "probe.py").write_text(script)
        with Sandbox(folder, containment=candidate, learner_imports=learner_imports) as box:
            result = box.run("probe.py", env={}, timeout=30)
    except (SandboxError, OSError) as exc:
        why = str(exc)[:200]
        return TransientProblem(why) if exc.errno in _TRANSIENT_ERRNOS else why
    finally:
        tempdirs.remove_tree(folder)
    if result.stopped == "timeout" or result.returncode == -signal.SIGKILL:   # out of time, or killed (OOM)
        return TransientProblem(result.describe()[:200])
    if result.returncode != 0:
        return (result.stderr_tail(1) or result.describe())[:200]
    if result.stdout.strip() != sys.version:
        return f"the interpreter runs as Python {result.stdout.strip()[:40]!r}"
    return ""


# --------------------------------------------------------------------------------------------------
# The sandbox

class Sandbox:
    """A temporary copy of a submission, removed on exit, where scripts run contained."""

    def __init__(self, submission: Path, limits: Limits = Limits(), containment: Containment | None = None,
                 learner_imports: tuple[str, ...] = (), warm_imports: tuple[str, ...] = ()):
        self.submission = Path(submission)
        self.limits = limits
        self._containment = containment
        self.learner_imports = learner_imports  # the broker's client libraries: the script must see them
        self.warm_imports = warm_imports        # those the warm template may import ahead (Broker.warm_imports)
        self.root: Path | None = None
        self.disk_bounded = False               # the run's folder is a tmpfs of limits.disk_bytes (runfs)
        self.uid: int | None = None
        self.gid: int | None = None
        self._supervisor: int | None = None    # pid of the current run's supervisor, while it runs
        self._process: subprocess.Popen | None = None  # the same, to signal it (Popen knows once it is reaped)

    @property
    def containment(self) -> Containment:
        if self._containment is None:
            self._containment = containment(self.learner_imports)
        return self._containment

    def __enter__(self) -> "Sandbox":
        contained = self.containment
        self.root = tempdirs.make("run")
        try:
            self.disk_bounded = runfs.mount_bounded(self.root, self.limits.disk_bytes, self.limits.disk_files)
            os.chmod(self.root, 0o711)  # the learner's uid may enter, not list
            self.workdir = self.root / "submission"
            self.home = self.root / "home"
            self.tmp = self.root / "tmp"
            self.logs = self.root / "log"  # the harness's: the learner may write its files, not replace them
            self.socket_dir = self.root / "sock"  # the harness's unix sockets for the learner (e.g. its broker)
            # symlinks stay links: a link to a harness file must not be copied in as the file itself
            try:
                runcopy.copy_submission(self.submission, self.workdir)
            except runcopy.NotCopied as exc:
                raise self._not_copied(exc) from None
            for folder, mode in ((self.home, 0o700), (self.tmp, 0o700), (self.logs, 0o755), (self.socket_dir, 0o755)):
                folder.mkdir(mode=mode)
                os.chmod(folder, mode)  # whatever the umask
            if contained.unprivileged_uid:
                self.uid = self.gid = random.randrange(*_UID_RANGE)
                for folder in (self.workdir, self.home, self.tmp):
                    runcopy.chown_tree(folder, self.uid, self.gid)
        except BaseException:
            tempdirs.remove_tree(self.root)
            raise
        return self

    def _not_copied(self, exc: runcopy.NotCopied) -> Exception:
        """What the learner is told when their submission could not be copied for the run: too large for the run's
        folder, or a file the harness may not read, is theirs to fix (a failed step that says so); anything else is
        the harness's or the machine's."""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) and self.disk_bounded:
            return CheckFailed(i18n.label("run.too_large", size=_size(self.limits.disk_bytes),
                                          count=self.limits.disk_files, file=exc.file))
        if exc.errno in (errno.EACCES, errno.EPERM):
            return CheckFailed(i18n.label("run.unreadable", file=exc.file, reason=exc.reason))
        return SandboxError(f"could not copy the submission for the run: {exc}", exc.errno)

    def __exit__(self, *exc) -> None:
        tempdirs.remove_tree(self.root)
        if self.uid is not None and not self.containment.isolated:
            # in its own namespaces all of that ended with the run
            runcopy.remove_leftovers(self.uid)

    @property
    def isolated(self) -> bool:
        """Whether scripts run in namespaces of their own: no network then, their broker is a unix
        socket in `socket_dir` (which they see at the same path)."""
        return self.containment.isolated

    def socket_path(self, name: str) -> Path:
        """Where the harness binds a unix socket for the learner's processes (root-owned folder:
        they can connect, not replace it)."""
        return self.socket_dir / name

    def learner_cpu(self) -> float:
        """CPU seconds (user + system) the current run's learner processes have had so far: every
        descendant of its supervisor, and those that ended and were reaped. 0.0 between runs.
        Unlike real time, a busy machine does not make this grow."""
        pid = self._supervisor
        return procfs.tree_cpu(pid) if pid is not None else 0.0

    def learner_running(self) -> bool:
        """Whether a thread of the current run's learner processes is running or ready to run (state
        R): on a busy machine a thread can wait seconds for a CPU, and must not be taken for idle."""
        pid = self._supervisor
        return pid is not None and procfs.tree_running(pid)

    def learner_threads(self) -> int:
        """Threads of the current run's learner processes now (0 between runs): what a check samples
        to tell a worker that starts a thread per message from one whose threads stay bounded."""
        pid = self._supervisor
        return procfs.tree_threads(pid) if pid is not None else 0

    def kill(self) -> None:
        """End the current run's processes at once, with SIGKILL, as a crash or a power cut would: for a
        check of what survives one. The run then ends as killed by that signal (not as stopped), and
        whatever the learner meant to do on SIGTERM never runs. Nothing happens between runs."""
        process = self._process
        if process is not None:
            try:
                process.send_signal(STOP_NOW)
            except ProcessLookupError:
                pass

    def has(self, script: str) -> bool:
        return (self.workdir / script).is_file()

    def log_file(self, name: str) -> Path:
        """A file the learner's processes may write (e.g. the call log), in a folder they cannot
        change: they cannot swap it for a FIFO or a link that would hang or mislead the harness."""
        path = self.logs / name
        path.touch(mode=0o644)
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)
        return path

    def environment(self, extra: dict[str, str]) -> dict[str, str]:
        env = _inherited_environment()
        env.update(HOME=str(self.home), TZ="UTC", PYTHONPATH=str(SITE_DIR),
                   PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8",
                   RETRYLAB_SITE_ACTIVE="1", TMPDIR=str(self.tmp))
        env.setdefault("PATH", os.defpath)
        env.update(extra)
        return env

    def run(self, script: str, *, env: dict[str, str], timeout: float, args: tuple[str, ...] = (),
            stop_when: Callable[[], bool] | None = None, poll: float = 0.02) -> ScriptResult:
        started = time.monotonic()
        run_id = f"{os.environ.get(RUN_TAG_VARIABLE, 'run')}-{secrets.token_hex(6)}"
        learner_env = self.environment(env)
        learner_env[RUN_ID_VARIABLE] = run_id
        # a uid of its own bounds the processes already (RLIMIT_NPROC); joining a cgroup costs ~15 ms
        cgroup = None if self.uid is not None else cgroups.make(self.containment.cgroups, run_id,
                                                                self.limits.processes + self._helpers)
        status_r, status_w = os.pipe()
        config_r, config_w = os.pipe()
        try:
            config = self._config(script, learner_env, status_w, [cgroup] if cgroup else [], args)
            proc = self._start_supervisor(config, status_w, config_r, learner_env["PATH"])
        except BaseException:
            os.close(status_r)
            os.close(config_w)
            if cgroup:
                cgroups.remove(cgroup)
            raise
        finally:
            os.close(status_w)
            os.close(config_r)
        try:  # a pipe, not argv: the environment it holds is nobody else's to read in /proc
            with open(config_w, "wb") as config_pipe:
                config_pipe.write(marshal.dumps(config))
        except BrokenPipeError:
            pass  # the supervisor is gone already; its missing report says so
        out, err = CappedBuffer(self.limits.output_bytes), CappedBuffer(self.limits.output_bytes)
        readers = [_drain(proc.stdout, out), _drain(proc.stderr, err)]
        stopped = None
        self._supervisor, self._process = proc.pid, proc
        try:
            try:
                while proc.poll() is None:
                    if time.monotonic() - started > timeout:
                        stopped = "timeout"
                        break
                    if stop_when is not None and stop_when():
                        stopped = "settled"
                        break
                    # the supervisor's report comes just before it exits: no need to poll for that
                    if select.select([status_r], [], [], poll)[0]:
                        break
            except BaseException:  # interrupted (a step's time limit, Ctrl-C, a failing stop condition)
                self._stop(proc, STOP_NOW, run_id, cgroup)  # never leave the learner's processes running
                raise
            if stopped:
                self._stop(proc, STOP, run_id, cgroup)
            else:
                self._stop(proc, None, run_id, cgroup)  # it exited: the supervisor is clearing up
            for reader in readers:
                reader.join(timeout=2)
            report = _read_report(status_r)
        finally:
            self._supervisor, self._process = None, None
            os.close(status_r)
            if cgroup:
                cgroups.remove(cgroup)
        if report.get("error"):
            raise SandboxError(f"could not run {script}: {report['error']}")
        returncode = None
        if not stopped:
            returncode = report["exit_code"] if report.get("exit_code") is not None else -(report.get("signal") or signal.SIGKILL)
        stderr = err.text()
        return ScriptResult(script=script, returncode=returncode, stopped=stopped, stdout=out.text(),
                            stderr=stderr, seconds=time.monotonic() - started,
                            limit=self._limit_hit(report, returncode, stopped, stderr),
                            peak_processes=report.get("peak_processes"))

    def _start_supervisor(self, config: dict, status_w: int, config_r: int, path: str):
        """The run's supervisor: forked from the warm learner template where it serves this containment (the
        script then runs in a fork too, with the learner side already imported), else two cold interpreters."""
        if warmstart.enabled() and self.containment.namespaces != "bwrap":  # bubblewrap must exec its target
            try:
                warm = warmstart.template(self.warm_imports, self.template_environment())
                config.update(parent=warm.pid, in_process=True)
                return warm.fork_run(status_w, config_r)
            except (OSError, warmstart.TemplateError):
                config.update(parent=os.getpid(), in_process=False)  # slower, and just as contained
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", _SUPERVISOR_CMD, str(config_r)],
            cwd="/", env={"PATH": path}, pass_fds=(status_w, config_r),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)

    @staticmethod
    def template_environment() -> dict[str, str]:
        """What a warm template starts with: a learner process's environment as its interpreter reads it at
        start-up (encoding, buffering, path, locale), without anything of one run or sandbox."""
        env = _inherited_environment()
        env.update(HOME="/nonexistent", TZ="UTC", PYTHONPATH=str(SITE_DIR), PYTHONDONTWRITEBYTECODE="1",
                   PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8")
        env.setdefault("PATH", os.defpath)
        return env

    def _config(self, script: str, env: dict[str, str], status_fd: int, cgroups: list[str],
                args: tuple[str, ...] = ()) -> dict:
        limits = self.limits
        rlimits = [(resource.RLIMIT_DATA, limits.memory_bytes, limits.memory_bytes),
                   (resource.RLIMIT_AS, limits.address_space_bytes, limits.address_space_bytes),
                   (resource.RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes),
                   # SIGXCPU at the soft limit says why; SIGKILL follows if it is ignored
                   (resource.RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds + 2),
                   (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
                   (resource.RLIMIT_CORE, 0, 0)]
        hard_bound = bool(cgroups)
        helpers = self._helpers
        if self.uid is not None:
            rlimits.append((resource.RLIMIT_NPROC, limits.processes + helpers, limits.processes + helpers))
            hard_bound = True
        elif os.geteuid() != 0:  # counts all this user's tasks (threads): leave room for those running
            budget = procfs.tasks_of_uid(os.geteuid()) + limits.processes + helpers
            rlimits.append((resource.RLIMIT_NPROC, budget, budget))
            hard_bound = True
        rlimits = [(which, _within_hard(which, soft), _within_hard(which, hard)) for which, soft, hard in rlimits]
        expose, mounts = [], []
        namespaces = self.containment.namespaces
        files = {Path(v).resolve() for v in env.values() if v.startswith("/") and os.path.isfile(v)}
        if namespaces:
            mounts = mount_plan(self.root.resolve(), files, limits.file_bytes, self.learner_imports)
            if namespaces == "bwrap" and self.uid is not None:
                expose = exposures({Path(op[1]) for op in mounts if op[0] in ("ro", "rw")})
        elif self.uid is not None:
            needed = set(needed_paths()) | {self.root.resolve()} | {f.parent for f in files}
            expose = exposures(needed)
        return {"argv": [sys.executable, script, *map(str, args)], "cwd": str(self.workdir), "env": env,
                "rlimits": rlimits, "uid": self.uid, "gid": self.gid, "expose": expose,
                "namespaces": namespaces, "bwrap": self.containment.bwrap, "mounts": mounts,
                "helpers": helpers, "memory": limits.memory_bytes,
                "cgroups": cgroups, "processes": limits.processes, "watchdog": not hard_bound,
                "grace": STOP_GRACE, "status_fd": status_fd, "parent": os.getpid()}

    @property
    def _helpers(self) -> int:
        """Processes of the run's uid that are not the script's: bubblewrap's two, or the init."""
        return {"bwrap": 2, "unshare": 1}.get(self.containment.namespaces, 0)

    def _stop(self, proc: subprocess.Popen, how: int | None, run_id: str, cgroup: str | None) -> None:
        """Have the supervisor end the run (`how` = STOP or STOP_NOW; None: it is ending already) and
        wait for it; if it does not manage, kill it and sweep up here."""
        if how is not None:
            try:
                proc.send_signal(how)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=STOP_GRACE + KILL_BUDGET + 2)
            return
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        sweep(run_id, cgroup=cgroup, uid=self.uid)

    def _limit_hit(self, report: dict, returncode: int | None, stopped: str | None, stderr: str) -> str | None:
        """Which resource limit ended the script (or hurt it), from how it ended and its last words."""
        limits = self.limits
        if report.get("over_memory_limit"):
            return limits.phrase("memory")
        if report.get("over_process_limit"):
            return limits.phrase("processes")
        if returncode == 0 and not stopped:
            return None
        sig = report.get("signal")
        tail = stderr[-4000:]
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and (report.get("cpu") or 0) >= limits.cpu_seconds):
            return limits.phrase("cpu")
        if sig == signal.SIGXFSZ or "File too large" in tail:
            return limits.phrase("file size")
        if self.disk_bounded and ("No space left on device" in tail or runfs.full(self.root)):
            return limits.phrase("disk")
        if "MemoryError" in tail or "Cannot allocate memory" in tail:
            return limits.phrase("memory")
        if _task_refused(tail):
            return limits.phrase("processes")
        return None


def _task_refused(tail: str) -> bool:
    """Whether the script's last words say a fork or a new thread was refused (EAGAIN). The same words come from
    a BlockingIOError of a non-blocking socket or lock, which is no limit: so a "Resource temporarily
    unavailable" counts only where a line just before it names a fork or a spawn (os.fork, subprocess's
    _fork_exec, bash's "fork: retry")."""
    if "can't start new thread" in tail:
        return True
    lines = tail.splitlines()
    return any("Resource temporarily unavailable" in line and any(
        word in before for before in lines[max(0, i - 4):i + 1] for word in ("fork", "spawn"))
        for i, line in enumerate(lines))



def _within_hard(which: int, value: int) -> int:
    """Never above the harness's own hard limit (raising it needs privileges we may not have)."""
    _, hard = resource.getrlimit(which)
    return value if hard == resource.RLIM_INFINITY else min(value, hard)




def _read_report(fd: int) -> dict:
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    try:
        report = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        report = None
    if not isinstance(report, dict):
        return {"error": None, "signal": signal.SIGKILL, "clean": False}  # the supervisor was killed
    return report




def sweep(run_id: str, *, cgroup: str | None = None, uid: int | None = None) -> None:
    """Kill what a run left behind, from the harness (used only if its supervisor failed)."""
    for _ in range(50):
        victims = set(procfs.find_processes(f"{RUN_ID_VARIABLE}={run_id}")) | cgroups.members([cgroup] if cgroup else [])
        if uid is not None:
            victims |= set(procfs.processes_of_uid(uid))
        if not victims:
            return
        kill(victims, signal.SIGKILL)
        time.sleep(0.02)




def _drain(stream, buffer: CappedBuffer) -> threading.Thread:
    def pump():
        with stream:
            while chunk := stream.read1(65536):
                buffer.feed(chunk)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread
