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
  carries out the same mount plan either way, `_mount_plan`). It sees the system read-only, what
  Python needs, its run's folder at the same path, private /tmp, /var/tmp, /run/lock, /dev/shm, a
  fresh /proc; no network: the harness's unix sockets for it live in `Sandbox.socket_dir`
  (root/"sock", the harness's, 0755), which it sees at the same path. Where neither works, isolation
  is partial (`Containment.isolated` is False): the report says so, `--isolation required` refuses.
- Resource limits: address space, CPU time, file size, open files, no core dumps. Hitting one is
  named in `ScriptResult.describe()` ("worker.py was stopped: it exceeded the 1 GiB memory limit"), in
  the language current when the script ran and when it is described (retrylab.i18n).
"""
from __future__ import annotations

import dataclasses
import functools
import marshal
import os
import random
import resource
import secrets
import select
import shutil
import signal
import site
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from retrylab import i18n, tempdirs
from retrylab.tempdirs import remove_tree as _remove_tree
from retrylab.supervisor import (_KILL_BUDGET, STOP, STOP_NOW, _cgroup_members, _kill, descendants,
                                 processes_of_uid)

__all__ = ["CappedBuffer", "Containment", "Limits", "Sandbox", "SandboxError", "ScriptResult",
           "containment", "descendants", "find_processes", "isolation_problem", "process_tree_cpu",
           "processes_of_uid", "sweep"]

SITE_DIR = Path(__file__).resolve().parent / "learner_site" / "pythonpath"
_HARNESS_DIR = str(Path(__file__).resolve().parent)
# from supervisor.py's compiled file when there is one (a script would be compiled on every start)
_SUPERVISOR_CMD = ("import sys; sys.path.insert(0, {!r}); import supervisor; "
                   "supervisor.main(sys.argv)").format(_HARNESS_DIR)
_ENV_ALLOWLIST = ("PATH", "LANG", "LANGUAGE", "TERM")
RUN_ID_VARIABLE = "RETRYLAB_RUN_ID"     # in every learner process's environment: which run it belongs to
RUN_TAG_VARIABLE = "RETRYLAB_RUN_TAG"   # in the harness's environment: a prefix for run ids (tests)
STOP_GRACE = 0.5                        # seconds between SIGTERM and SIGKILL when a run is stopped
_UID_RANGE = (2_000_000_000, 2_100_000_000)  # uids for learner processes: one per run, never a real user
_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # writable by anyone: cleared of a run's uid's files after it


class SandboxError(RuntimeError):
    """The harness could not run the learner's script at all (a harness or machine problem)."""


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 1 << 30          # address space
    file_bytes: int = 256 << 20          # largest file a script may write
    cpu_seconds: int = 60
    output_bytes: int = 64 << 10         # kept of each stream: the first and last halves
    processes: int = 64                  # processes and threads the script may have at once
    open_files: int = 1024

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

    @property
    def crashed(self) -> bool:
        return self.stopped is None and self.returncode not in (0, None)

    def describe(self) -> str:
        """How the script ended, for a learner, in the current language (i18n.use)."""
        facts = dict(script=self.script, limit=self.limit, seconds=self.seconds)
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
# What containment this machine allows (measured once per harness process)

NAMESPACES_VARIABLE = "RETRYLAB_NAMESPACES"  # "bwrap", "unshare" or "none": use only that (CI runs each)
_NAMESPACE_KINDS = ("bwrap", "unshare")


@dataclass(frozen=True)
class Containment:
    """How learner scripts are contained here. `containment()` measures it; tests may force a weaker one."""
    unprivileged_uid: bool = False    # root: run each script as a fresh uid (needs the probe to pass)
    cgroups: tuple[str, ...] = ()     # parent directories under which a pids cgroup per run is made
    notes: tuple[str, ...] = ()       # why something is not used (shown by `describe`)
    namespaces: str = ""              # "bwrap", "unshare" (own mount/net/IPC/PID/UTS namespaces), "": none
    bwrap: str = ""                   # the bubblewrap executable (namespaces == "bwrap")

    @property
    def isolated(self) -> bool:
        """Whether the script has namespaces of its own (else isolation is partial: it shares the
        machine's network, /proc, IPC and scratch folders)."""
        return bool(self.namespaces)

    def describe(self) -> str:
        parts = ["supervisor with subreaper (kills every descendant)"]
        if self.namespaces:
            how = "bubblewrap" if self.namespaces == "bwrap" else "unshare(2)"
            parts.append(f"own mount, network, IPC, PID and UTS namespaces ({how}): no network but its "
                         f"broker's unix socket")
        else:
            parts.append("isolation is partial: no namespaces of its own")
        if self.unprivileged_uid:
            parts.append("a fresh unprivileged uid per run (RLIMIT_NPROC, kill by uid)")
        else:
            if os.geteuid() == 0:
                parts.append("root without capabilities")
            else:
                parts.append("this user's own uid (RLIMIT_NPROC above the tasks it runs)")
            if self.cgroups:
                parts.append(f"a pids cgroup per run under {', '.join(self.cgroups)}")
            elif os.geteuid() == 0:
                parts.append("no cgroup: the supervisor counts processes")
        return "; ".join(parts) + "".join(f"\n  note: {n}" for n in self.notes)


_detected: Containment | None = None
_detect_lock = threading.Lock()


def containment() -> Containment:
    """The strongest containment that works on this machine, measured on first use."""
    global _detected
    with _detect_lock:
        if _detected is None:
            _detected = _detect()
        return _detected


def _detect() -> Containment:
    if os.geteuid() != 0:
        base = Containment(cgroups=_usable_cgroups(), notes=("not root: scripts run as this user",))
        return _with_namespaces(base)
    notes = []
    cgroups = _usable_cgroups()
    if not cgroups:
        notes.append("no writable pids cgroup: the supervisor counts processes instead")
    base = Containment(unprivileged_uid=True, cgroups=cgroups)
    problem = _probe(base)
    if problem:
        notes.append(f"an unprivileged uid does not work here ({problem}): scripts run as root "
                     f"without capabilities")
        return _with_namespaces(Containment(cgroups=cgroups, notes=tuple(notes)))
    return _with_namespaces(Containment(unprivileged_uid=True, cgroups=cgroups, notes=tuple(notes)))


ISOLATION_CHOICES = ("auto", "required")


def isolation_problem(isolation: str) -> str:
    """'' if learner code may run here under `isolation` ("auto": however the machine allows;
    "required": only in namespaces of its own), else the one line saying why not."""
    if isolation != "required" or containment().isolated:
        return ""
    why = "; ".join(n for n in containment().notes if "namespace" in n or "bwrap" in n)
    return (f"--isolation required: learner code cannot run in namespaces of its own here "
            f"({why or 'no bubblewrap and no unshare(2)'})")


def _with_namespaces(base: Containment) -> Containment:
    """`base` with the first way of giving scripts namespaces of their own that works here:
    bubblewrap where it is installed, else unshare(2) directly (RETRYLAB_NAMESPACES picks one)."""
    wanted = os.environ.get(NAMESPACES_VARIABLE, "").strip().lower()
    kinds = _NAMESPACE_KINDS if wanted in ("", "auto") else tuple(k for k in _NAMESPACE_KINDS if k == wanted)
    notes = list(base.notes)
    for kind in kinds:
        bwrap = (shutil.which("bwrap") or "") if kind == "bwrap" else ""
        if kind == "bwrap" and not bwrap:
            notes.append("bubblewrap (bwrap) is not installed")
            continue
        candidate = dataclasses.replace(base, namespaces=kind, bwrap=bwrap)
        problem = _probe(candidate)
        if not problem:
            return dataclasses.replace(candidate, notes=tuple(notes))
        notes.append(f"namespaces through {kind} do not work here ({problem})")
    if wanted == "none":
        notes.append(f"namespaces turned off ({NAMESPACES_VARIABLE}=none)")
    elif wanted and wanted not in ("auto", *_NAMESPACE_KINDS):
        notes.append(f"{NAMESPACES_VARIABLE}={wanted!r} is not one of bwrap, unshare, none")
    return dataclasses.replace(base, notes=tuple(notes))


def _probe(candidate: Containment) -> str:
    """'' if a learner process runs with `candidate` and imports what the learner site needs."""
    script = "import sys, redis, time_machine\nprint(sys.version)\n"
    if candidate.namespaces:  # really in a PID namespace of its own
        script += "import os\nassert os.getpid() < 10, os.getpid()\n"
    folder = tempdirs.make("probe")
    try:
        Path(folder, "probe.py").write_text(script)
        with Sandbox(folder, containment=candidate) as box:
            result = box.run("probe.py", env={}, timeout=30)
    except (SandboxError, OSError) as exc:
        return str(exc)[:200]
    finally:
        tempdirs.remove_tree(folder)
    if result.returncode != 0:
        return (result.stderr_tail(1) or result.describe())[:200]
    if result.stdout.strip() != sys.version:
        return f"the interpreter runs as Python {result.stdout.strip()[:40]!r}"
    return ""


def _mounts(kind: str) -> list[tuple[str, str]]:
    """(mount point, options) of each filesystem of type `kind`."""
    found = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 4 and fields[2] == kind:
                    found.append((fields[1].replace("\\040", " "), fields[3]))
    except OSError:
        pass
    return found


def _own_cgroups() -> dict[str, str]:
    """hierarchy ('' for v2, else the controllers) -> this process's cgroup path in it."""
    own = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                own[controllers] = path
    except (OSError, ValueError):
        pass
    return own


def _usable_cgroups() -> tuple[str, ...]:
    """Directories where a per-run cgroup with a pids.max can be made: v2 if it offers the pids
    controller, else v1's pids hierarchy. Tried once, for real."""
    own = _own_cgroups()
    candidates = []
    for mount, _ in _mounts("cgroup2"):
        if "" in own:
            candidates.append(os.path.join(mount, own[""].lstrip("/")))
    for mount, options in _mounts("cgroup"):
        for controllers, path in own.items():
            if "pids" in controllers.split(",") and "pids" in options.split(","):
                candidates.append(os.path.join(mount, path.lstrip("/")))
    for parent in candidates:
        probe = os.path.join(parent, f"retrylab-probe-{os.getpid()}-{secrets.token_hex(3)}")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        try:
            with open(os.path.join(probe, "pids.max"), "w") as f:
                f.write("10")
            return (parent,)
        except OSError:
            continue
        finally:
            _remove_cgroup(probe)
    return ()


def _remove_cgroup(path: str) -> None:
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # a killed task can take a moment to leave


@functools.lru_cache(maxsize=1)
def _needed_paths() -> frozenset[Path]:
    """Directories a learner process must reach: the interpreter, its libraries, the harness."""
    paths = {Path(sys.base_prefix), Path(sys.prefix), Path(os.path.realpath(sys.executable)).parent,
             Path(__file__).resolve().parent.parent, SITE_DIR}
    for entry in [*site.getsitepackages(), *sys.path]:
        if entry and os.path.isdir(entry):
            paths.add(Path(entry))
    return frozenset(p.resolve() for p in paths if p.exists())


_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_SMALL_SCRATCH = 64 << 20   # bytes of tmpfs for /var/tmp, /run/lock, /dev/shm (memory: it is a tmpfs)


@functools.lru_cache(maxsize=1)
def _learner_paths() -> tuple[str, ...]:
    """What a learner process reads besides the system: the interpreter's prefixes, its site-packages
    (redis, time_machine), and the harness's learner-side package. Of the harness only
    retrylab/__init__.py and retrylab/learner_site: an editable install maps `retrylab` to the
    repository's harness/ folder, and nothing else of the repository is the learner's to read."""
    import redis
    import time_machine
    package = Path(__file__).resolve().parent
    candidates = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)),
                  *site.getsitepackages(), os.path.dirname(os.path.dirname(redis.__file__)),
                  os.path.dirname(time_machine.__file__), str(package / "__init__.py"),
                  str(package / "learner_site")]
    return _outermost(Path(c).resolve() for c in candidates if c and os.path.exists(c))


def _outermost(paths) -> tuple[str, ...]:
    """`paths` without those inside another one (a bind of the outer one shows them already)."""
    unique = sorted(set(paths), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in unique:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return tuple(str(p) for p in kept)


def _mount_plan(root: Path, files, limits: Limits) -> list[tuple]:
    """The filesystem a script sees in its own mount namespace, in the order it is laid out
    (supervisor.py carries it out itself, or hands it to bubblewrap): a fresh /proc, a minimal
    /dev, private scratch tmpfs, the system read-only, what Python needs read-only, the run's folder
    at the same path, and the files the environment names (e.g. the instrumented taskproc).
    ("ro"|"rw", source, target), ("tmpfs", target, bytes), ("symlink", link text, path), ("proc"|"dev", target)."""
    plan: list[tuple] = [("proc", "/proc"), ("dev", "/dev"), ("tmpfs", "/tmp", limits.file_bytes)]
    plan += [("tmpfs", folder, _SMALL_SCRATCH) for folder in ("/var/tmp", "/run/lock", "/dev/shm")]
    binds: list[Path] = []
    for folder in _SYSTEM_DIRS:
        if os.path.islink(folder):
            plan.append(("symlink", os.readlink(folder), folder))
        elif os.path.isdir(folder):
            binds.append(Path(folder))
    shown = [Path(p) for p in _outermost([*binds, *map(Path, _learner_paths())])]
    plan += [("ro", str(p), str(p)) for p in shown]
    plan.append(("rw", str(root), str(root)))
    for path in sorted(files):
        if not any(s == path or s in path.parents for s in [*shown, root]):
            plan.append(("ro", str(path), str(path)))
    return plan


def _exposures(paths) -> list[tuple[str, list[str]]]:
    """For each directory others cannot enter on the way to a needed path (e.g. /root, mode 0700):
    that directory and the needed paths below it, to be bind-mounted onto a tmpfs laid over it."""
    groups: dict[Path, set[Path]] = {}
    for path in paths:
        for ancestor in reversed(path.parents):  # from / down
            if ancestor == Path("/"):
                continue
            try:
                mode = ancestor.stat().st_mode
            except OSError:
                break
            if not mode & stat.S_IXOTH:
                groups.setdefault(ancestor, set()).add(path)
                break
    result = []
    for blocker, below in sorted(groups.items()):
        kept = sorted(p for p in below if not any(q != p and q in p.parents for q in below))
        result.append((str(blocker), [str(p) for p in kept]))
    return result


# --------------------------------------------------------------------------------------------------
# The sandbox

class Sandbox:
    """A temporary copy of a submission, removed on exit, where scripts run contained."""

    def __init__(self, submission: Path, limits: Limits = Limits(), containment: Containment | None = None):
        self.submission = Path(submission)
        self.limits = limits
        self._containment = containment
        self.root: Path | None = None
        self.uid: int | None = None
        self.gid: int | None = None
        self._supervisor: int | None = None    # pid of the current run's supervisor, while it runs

    @property
    def containment(self) -> Containment:
        if self._containment is None:
            self._containment = containment()
        return self._containment

    def __enter__(self) -> "Sandbox":
        contained = self.containment
        self.root = tempdirs.make("run")
        try:
            os.chmod(self.root, 0o711)  # the learner's uid may enter, not list
            self.workdir = self.root / "submission"
            self.home = self.root / "home"
            self.tmp = self.root / "tmp"
            self.logs = self.root / "log"  # the harness's: the learner may write its files, not replace them
            self.socket_dir = self.root / "sock"  # the harness's unix sockets for the learner (e.g. its broker)
            # symlinks stay links: a link to a harness file must not be copied in as the file itself
            shutil.copytree(self.submission, self.workdir, symlinks=True, copy_function=_copy_regular,
                            ignore=shutil.ignore_patterns("__pycache__", ".git"))
            for folder, mode in ((self.home, 0o700), (self.tmp, 0o700), (self.logs, 0o755), (self.socket_dir, 0o755)):
                folder.mkdir(mode=mode)
                os.chmod(folder, mode)  # whatever the umask
            if contained.unprivileged_uid:
                self.uid = self.gid = random.randrange(*_UID_RANGE)
                for folder in (self.workdir, self.home, self.tmp):
                    _chown_tree(folder, self.uid, self.gid)
        except BaseException:
            _remove_tree(self.root)
            raise
        return self

    def __exit__(self, *exc) -> None:
        _remove_tree(self.root)
        if self.uid is not None and not self.containment.isolated:
            # without namespaces of its own, what the run's uid left in the shared scratch folders
            # and SysV IPC goes too (in its own namespaces all of that ended with the run)
            for folder in _SCRATCH:
                _remove_owned(folder, self.uid)
            _remove_ipc_of(self.uid)

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
        return process_tree_cpu(pid) if pid is not None else 0.0

    def learner_running(self) -> bool:
        """Whether a thread of the current run's learner processes is running or ready to run (state
        R): on a busy machine a thread can wait seconds for a CPU, and must not be taken for idle."""
        pid = self._supervisor
        return pid is not None and process_tree_running(pid)

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
        env = {k: v for k, v in os.environ.items() if k in _ENV_ALLOWLIST or k.startswith("LC_")}
        env.update(HOME=str(self.home), TZ="UTC", PYTHONPATH=str(SITE_DIR),
                   PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8",
                   RETRYLAB_SITE_ACTIVE="1", TMPDIR=str(self.tmp))
        env.setdefault("PATH", os.defpath)
        env.update(extra)
        return env

    def run(self, script: str, *, env: dict[str, str], timeout: float,
            stop_when: Callable[[], bool] | None = None, poll: float = 0.02) -> ScriptResult:
        started = time.monotonic()
        run_id = f"{os.environ.get(RUN_TAG_VARIABLE, 'run')}-{secrets.token_hex(6)}"
        learner_env = self.environment(env)
        learner_env[RUN_ID_VARIABLE] = run_id
        # a uid of its own bounds the processes already (RLIMIT_NPROC); joining a cgroup costs ~15 ms
        cgroup = None if self.uid is not None else _make_cgroup(self.containment.cgroups, run_id,
                                                                self.limits.processes + self._helpers)
        status_r, status_w = os.pipe()
        config_r, config_w = os.pipe()
        try:
            config = self._config(script, learner_env, status_w, [cgroup] if cgroup else [])
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-c", _SUPERVISOR_CMD, str(config_r)],
                cwd="/", env={"PATH": learner_env["PATH"]}, pass_fds=(status_w, config_r),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True)
        except BaseException:
            os.close(status_r)
            os.close(config_w)
            if cgroup:
                _remove_cgroup(cgroup)
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
        self._supervisor = proc.pid
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
            self._supervisor = None
            os.close(status_r)
            if cgroup:
                _remove_cgroup(cgroup)
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

    def _config(self, script: str, env: dict[str, str], status_fd: int, cgroups: list[str]) -> dict:
        limits = self.limits
        rlimits = [(resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
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
            budget = _tasks_of_uid(os.geteuid()) + limits.processes + helpers
            rlimits.append((resource.RLIMIT_NPROC, budget, budget))
            hard_bound = True
        rlimits = [(which, _within_hard(which, soft), _within_hard(which, hard)) for which, soft, hard in rlimits]
        expose, mounts = [], []
        namespaces = self.containment.namespaces
        files = {Path(v).resolve() for v in env.values() if v.startswith("/") and os.path.isfile(v)}
        if namespaces:
            mounts = _mount_plan(self.root.resolve(), files, limits)
            if namespaces == "bwrap" and self.uid is not None:
                expose = _exposures({Path(op[1]) for op in mounts if op[0] in ("ro", "rw")})
        elif self.uid is not None:
            needed = set(_needed_paths()) | {self.root.resolve()} | {f.parent for f in files}
            expose = _exposures(needed)
        return {"argv": [sys.executable, script], "cwd": str(self.workdir), "env": env,
                "rlimits": rlimits, "uid": self.uid, "gid": self.gid, "expose": expose,
                "namespaces": namespaces, "bwrap": self.containment.bwrap, "mounts": mounts,
                "helpers": helpers,
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
            proc.wait(timeout=STOP_GRACE + _KILL_BUDGET + 2)
            return
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        sweep(run_id, cgroup=cgroup, uid=self.uid)

    def _limit_hit(self, report: dict, returncode: int | None, stopped: str | None, stderr: str) -> str | None:
        """Which resource limit ended the script (or hurt it), from how it ended and its last words."""
        limits = self.limits
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
        if "MemoryError" in tail or "Cannot allocate memory" in tail:
            return limits.phrase("memory")
        if "Resource temporarily unavailable" in tail or "can't start new thread" in tail:
            return limits.phrase("processes")  # fork or thread creation refused (EAGAIN)
        return None


_TICK = os.sysconf("SC_CLK_TCK")


def _stat_times(pid: int) -> tuple[int, int, int, int] | None:
    """utime, stime, cutime, cstime of `pid` in clock ticks (/proc/PID/stat), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]), int(fields[12]), int(fields[13]), int(fields[14])
    except (OSError, IndexError, ValueError):
        return None


def _children(pid: int) -> list[int]:  # /proc/PID/task/TID/children: cheaper than the whole table
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return found


def process_tree_cpu(root: int) -> float:
    """CPU seconds of every process below `root` (their own and their reaped children's), plus what
    `root` reaped (the supervisor, a subreaper, reaps whatever the script leaves): `root`'s own time
    is not counted. Read from the host's /proc, which sees into the learner's namespaces."""
    own = _stat_times(root)
    if own is None:
        return 0.0
    ticks = own[2] + own[3]
    for pid in _tree(root):
        times = _stat_times(pid)
        ticks += sum(times) if times else 0
    return ticks / _TICK


def _tree(root: int) -> list[int]:
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return descendants(root)
    found, todo = [], _children(root)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(_children(pid))
    return found


def process_tree_running(root: int) -> bool:
    """Whether any thread of any process below `root` is running or runnable (state R)."""
    for pid in _tree(root):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"R":
                        return True
            except (OSError, IndexError):
                continue
    return False


def _tasks_of_uid(uid: int) -> int:
    """How many tasks (threads) `uid` runs: what RLIMIT_NPROC counts."""
    total = 0
    for pid in processes_of_uid(uid):
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith(b"Threads:")), 1)
        except (OSError, ValueError, IndexError):
            continue
    return total


def _within_hard(which: int, value: int) -> int:
    """Never above the harness's own hard limit (raising it needs privileges we may not have)."""
    _, hard = resource.getrlimit(which)
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def _make_cgroup(parents: tuple[str, ...], run_id: str, processes: int) -> str | None:
    for parent in parents:
        path = os.path.join(parent, f"retrylab-{run_id}")
        try:
            os.mkdir(path)
        except OSError:
            continue
        try:
            with open(os.path.join(path, "pids.max"), "w") as f:
                f.write(str(processes))
            return path
        except OSError:
            _remove_cgroup(path)
    return None


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


def find_processes(marker: str) -> list[int]:
    """Processes whose environment contains `marker` (e.g. a run id or a test's run tag)."""
    needle = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def sweep(run_id: str, *, cgroup: str | None = None, uid: int | None = None) -> None:
    """Kill what a run left behind, from the harness (used only if its supervisor failed)."""
    for _ in range(50):
        victims = set(find_processes(f"{RUN_ID_VARIABLE}={run_id}")) | _cgroup_members([cgroup] if cgroup else [])
        if uid is not None:
            victims |= set(processes_of_uid(uid))
        if not victims:
            return
        _kill(victims, signal.SIGKILL)
        time.sleep(0.02)


def _copy_regular(src: str, dst: str) -> None:
    """Copy regular files only: a FIFO or a device in a submission would block or leak the copy."""
    if stat.S_ISREG(os.lstat(src).st_mode):
        shutil.copy2(src, dst)


def _chown_tree(top: Path, uid: int, gid: int) -> None:
    os.chown(top, uid, gid, follow_symlinks=False)
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)



def _remove_owned(folder: str, uid: int) -> None:
    """Remove the entries of `folder` (not below) that belong to `uid`."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            if entry.is_dir(follow_symlinks=False):
                _remove_tree(Path(entry.path))
            else:
                os.unlink(entry.path)
        except OSError:
            continue


def _remove_ipc_of(uid: int) -> None:
    """Remove the SysV message queues, shared memory segments and semaphore sets `uid` owns."""
    import ctypes
    libc = None
    for table, remove in (("msg", "msgctl"), ("shm", "shmctl"), ("sem", "semctl")):
        try:
            with open(f"/proc/sysvipc/{table}") as f:
                header, *rows = [line.split() for line in f if line.strip()]
        except (OSError, ValueError):
            continue
        ident, owner = header.index(f"{table}id" if table != "msg" else "msqid"), header.index("uid")
        for row in rows:
            if row[owner] == str(uid):
                libc = libc or ctypes.CDLL(None, use_errno=True)
                if table == "sem":
                    libc.semctl(int(row[ident]), 0, 0)  # IPC_RMID
                else:
                    getattr(libc, remove)(int(row[ident]), 0, None)


def _drain(stream, buffer: CappedBuffer) -> threading.Thread:
    def pump():
        with stream:
            while chunk := stream.read1(65536):
                buffer.feed(chunk)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread
