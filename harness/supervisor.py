"""The supervisor of one learner run: a process between the harness and the learner's script.

It is a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so whatever the script starts, even a daemon
that double-forks and calls setsid, stays its descendant. It forks the script's process (own
session, pids cgroup, resource limits, no capabilities, no_new_privs, as root a fresh unprivileged
uid), and, where the machine allows, its own namespaces (mount, network, IPC, PID, UTS: see
"Namespaces" below; otherwise, if the interpreter sits where that uid cannot enter, a private mount
namespace exposing just what it needs), then waits: when the script exits, or the harness asks it to stop (SIGTERM:
SIGTERM to every descendant, SIGKILL after a grace period; SIGUSR1: SIGKILL at once), it kills
every descendant and reports how the script ended and which limits it hit.

It starts for every learner run, so it imports only cheap standard modules (ctypes lazily) and is
started as `python -I -S -B -c "import supervisor ..."` from its compiled file: its config comes
marshalled on a pipe (not in argv, which anyone can read in /proc), its report goes back on another.
Used from the harness by retrylab.sandbox, which also uses its /proc helpers.

Namespaces (config["namespaces"]): the script sees only the filesystem the harness's mount plan
lists (config["mounts"], see retrylab.sandbox), a fresh /proc, private scratch tmpfs, and a network
namespace with no route out (its broker is a unix socket in the run's folder).
- "bwrap": the forked child, after rlimits and dropping to the run's uid, execs bubblewrap, which
  makes an unprivileged user namespace and the rest, then execs the interpreter. Directories the
  run's uid cannot enter on the way to a bind source (a pyenv under /root) are exposed first, as
  without namespaces (`_expose`). bubblewrap reports a death by signal N as exit status 128+N; the
  supervisor reads it back as that signal (a script's own `exit(128+N)` reads as that signal too).
- "unshare": the forked child unshares the namespaces itself (as root; else in a new user
  namespace mapping its own uid), forks an init (PID 1 of the new PID namespace) and exits, so the
  init becomes the supervisor's child. The init builds the new root, pivots into it, drops
  privileges, forks the script and passes its wait status back on a pipe.
Either way every process stays a descendant of the supervisor with a host PID, and one or two
helper processes (bubblewrap, the init) run as the run's uid: RLIMIT_NPROC leaves room for them and
the reported peak leaves them out.
"""
from __future__ import annotations

import marshal
import os
import resource
import signal
import stat
import time

_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = \
    0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOEXEC, _MS_REMOUNT = 1, 8, 32
_MNT_DETACH = 2
_ST_FLAGS = ((2, 2), (4, 4), (8, 8), (1024, 1024), (2048, 2048), (4096, 1 << 21))  # statvfs -> mount flags
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
_O_PATH = getattr(os, "O_PATH", 0o10000000)

STOP = signal.SIGTERM        # harness -> supervisor: stop the script (SIGTERM it, SIGKILL after grace)
STOP_NOW = signal.SIGUSR1    # harness -> supervisor: kill everything at once (the harness was interrupted)
_KILL_BUDGET = 5.0           # seconds the supervisor keeps killing before it reports failure
_libc = None


def _c():
    global _libc
    if _libc is None:
        import ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _prctl(option: int, arg: int = 0) -> None:
    import ctypes
    if _c().prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")


def _process_table() -> dict[int, int]:
    """pid -> parent pid of every process (not threads), from /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            table[int(name)] = int(data[data.rfind(b")") + 2:].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return table


def descendants(root: int) -> list[int]:
    """Every process below `root` in the process tree."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _process_table().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def processes_of_uid(uid: int) -> list[int]:
    """Processes whose real uid is `uid` (from /proc/PID/status: a process that made itself
    non-dumpable has its /proc folder owned by root)."""
    found, wanted = [], str(uid)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        if line.split()[1].decode() == wanted:
                            found.append(int(name))
                        break
        except (OSError, IndexError):
            continue
    return found


def _cgroup_members(paths) -> set[int]:
    members = set()
    for path in paths:
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                members.update(int(line) for line in f if line.strip())
        except (OSError, ValueError):
            continue
    return members


def _kill(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _expose(groups) -> None:
    """In a new mount namespace, cover each directory others cannot enter with an empty tmpfs that
    holds only the paths the script needs under it (bind mounts of the real ones)."""
    import ctypes
    libc = _c()

    def mount(source, target, fstype, flags, data):
        if libc.mount(source, target, fstype, ctypes.c_ulong(flags), data) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"mount {target!r}: {os.strerror(errno)}")

    if libc.unshare(_CLONE_NEWNS) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(CLONE_NEWNS): {os.strerror(errno)}")
    mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None)  # nothing done here reaches the host
    previous = os.umask(0o022)
    for blocker, paths in groups:
        handles = [os.open(path, _O_PATH | os.O_DIRECTORY) for path in paths]  # before they are hidden
        mount(b"tmpfs", os.fsencode(blocker), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=64k")
        for path, handle in zip(paths, handles):
            os.makedirs(path, 0o755, exist_ok=True)
            mount(f"/proc/self/fd/{handle}".encode(), os.fsencode(path), None, _MS_BIND | _MS_REC, None)
            os.close(handle)
    os.umask(previous)


def _clear_inheritable_capabilities() -> None:
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()
    if _c().capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    if data[0].inheritable or data[1].inheritable:
        data[0].inheritable = data[1].inheritable = 0
        if _c().capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capset")


def _drop_privileges(uid: int | None, gid: int | None) -> None:
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)  # setuid programs (su, sudo) cannot give anything back
    if os.geteuid() != 0:
        return
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):  # an empty bounding set: even uid 0 gets no capability at exec
        _prctl(_PR_CAPBSET_DROP, cap)
    try:
        _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError:
        pass  # kernels before 4.3 have no ambient set
    if uid is None:
        _clear_inheritable_capabilities()
        return
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _mount(source, target, fstype, flags, data=None) -> None:
    import ctypes
    enc = lambda v: os.fsencode(v) if isinstance(v, str) else v  # noqa: E731
    if _c().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target!r}: {os.strerror(errno)}")


def _syscall_ok(result: int, what: str) -> None:
    if result != 0:
        import ctypes
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _open_sources(mounts) -> dict[str, int]:
    """O_PATH handles of every bind source, opened while privileged (the run's uid may not be able
    to walk to them) and before the new root hides them."""
    handles = {}
    for op in mounts:
        if op[0] in ("ro", "rw") and op[1] not in handles:
            handles[op[1]] = os.open(op[1], _O_PATH | os.O_CLOEXEC)
    return handles


def _bwrap_argv(config: dict) -> list[str]:
    # Bind sources by path: bubblewrap makes itself non-dumpable, so it cannot follow
    # /proc/self/fd links (--bind-fd) to handles opened before the uid changed.
    os.set_inheritable(config["bwrap_status_fd"], True)
    argv = [config["bwrap"], "--unshare-all", "--die-with-parent", "--hostname", "retrylab",
            "--json-status-fd", str(config["bwrap_status_fd"])]
    for op in config["mounts"]:
        kind = op[0]
        if kind in ("ro", "rw"):
            argv += ["--ro-bind" if kind == "ro" else "--bind", op[1], op[2]]
        elif kind == "tmpfs":
            argv += ["--perms", "1777", "--size", str(op[2]), "--tmpfs", op[1]]
        elif kind == "symlink":
            argv += ["--symlink", op[1], op[2]]
        elif kind == "proc":
            argv += ["--proc", op[1]]
        elif kind == "dev":
            argv += ["--dev", op[1]]
    # its root is a tmpfs the run's uid owns in its user namespace: read-only, like the unshare path's
    return argv + ["--remount-ro", "/", "--chdir", config["cwd"], "--", *config["argv"]]


def _enter_namespaces() -> None:
    """This process into new mount, network, IPC, UTS and PID namespaces (the PID one holds its
    next child). Not root: in a new user namespace too, where it keeps its own uid and gid."""
    flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS | _CLONE_NEWPID
    if os.geteuid() == 0:
        _syscall_ok(_c().unshare(flags), "unshare")
        return
    uid, gid = os.geteuid(), os.getegid()
    _syscall_ok(_c().unshare(flags | _CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _build_root(mounts, handles: dict[str, int]) -> None:
    """Lay out the mount plan on a fresh tmpfs and make it this mount namespace's root."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here reaches the host
    new = "/tmp"  # any directory will do as the mount point: its content is hidden from here on
    _mount("tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
    previous = os.umask(0o022)
    for op in mounts:
        kind = op[0]
        if kind in ("ro", "rw"):
            target = new + op[2]
            if stat.S_ISDIR(os.fstat(handles[op[1]]).st_mode):
                os.makedirs(target, 0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
                open(target, "a").close()
            _mount(f"/proc/self/fd/{handles[op[1]]}", target, None, _MS_BIND | _MS_REC)
            if kind == "ro":  # a read-only remount must keep the flags the host's mount is locked with
                locked = os.statvfs(target).f_flag
                extra = sum(flag for st, flag in _ST_FLAGS if locked & st)
                _mount(None, target, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | extra)
        elif kind == "tmpfs":
            os.makedirs(new + op[1], 0o755, exist_ok=True)
            _mount("tmpfs", new + op[1], "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={op[2]}")
        elif kind == "symlink":
            os.makedirs(os.path.dirname(new + op[2]), 0o755, exist_ok=True)
            os.symlink(op[1], new + op[2])
        elif kind == "proc":
            os.makedirs(new + op[1], 0o755, exist_ok=True)
            _mount("proc", new + op[1], "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        elif kind == "dev":
            dev = new + op[1]
            os.makedirs(dev, 0o755, exist_ok=True)
            _mount("tmpfs", dev, "tmpfs", _MS_NOSUID, "mode=0755,size=64k")
            for name in _DEVICES:
                if os.path.exists(f"/dev/{name}"):
                    open(f"{dev}/{name}", "a").close()
                    _mount(f"/dev/{name}", f"{dev}/{name}", None, _MS_BIND)
            for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                                 ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
                os.symlink(target, f"{dev}/{name}")
    os.umask(previous)
    for handle in set(handles.values()):
        os.close(handle)
    os.chdir(new)
    number = {"x86_64": 155, "aarch64": 41, "riscv64": 41}[os.uname().machine]  # SYS_pivot_root
    _syscall_ok(_c().syscall(number, b".", b"."), "pivot_root")  # the old root now lies beneath the new
    _syscall_ok(_c().umount2(b".", _MNT_DETACH), "umount old root")
    _mount(None, "/", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.chdir("/")


def _init(config: dict, handles: dict[str, int], error_pipe: int) -> None:
    """PID 1 of the run's PID namespace: build its root, run the script, reap orphans, and pass
    the script's wait status to the supervisor. Never returns."""
    try:
        os.close(config["init_pid_fd"])  # the supervisor waits for its EOF before it watches the run
        _c().sethostname(b"retrylab", 8)
        _build_root(config["mounts"], handles)
        for which, soft, hard in config["rlimits"]:
            resource.setrlimit(which, (soft, hard))
        _drop_privileges(config["uid"], config["gid"])
        script = os.fork()
        if script == 0:
            os.chdir(config["cwd"])
            os.execve(config["argv"][0], config["argv"], config["env"])
    except BaseException as exc:  # noqa: BLE001
        try:
            os.write(error_pipe, f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")[:2000])
        finally:
            os._exit(127)
    os.close(error_pipe)
    while True:  # orphans of the namespace come here: reap them until the script itself ends
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue
        if pid == script:
            os.write(config["script_status_fd"], status.to_bytes(4, "little"))
            os._exit(0)  # the namespace ends with its init: the kernel kills what is left


def _become_script(config: dict, error_pipe: int) -> None:
    """In the forked child: contain this process, then exec the learner's script. Never returns."""
    try:
        os.close(config["status_fd"])
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.setsid()
        for path in config["cgroups"]:  # joined while still privileged
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write("0")
        namespaces = config["namespaces"]
        if namespaces == "unshare":
            _enter_namespaces()
            handles = _open_sources(config["mounts"])  # in the new mount namespace: binds need that
            init = os.fork()
            if init == 0:
                _init(config, handles, error_pipe)
            os.write(config["init_pid_fd"], init.to_bytes(4, "little"))
            os._exit(0)  # the init becomes the supervisor's child (it is a subreaper)
        if config["expose"]:  # bubblewrap too needs a way, as the run's uid, to what it binds
            _expose(config["expose"])
        for which, soft, hard in config["rlimits"]:
            resource.setrlimit(which, (soft, hard))
        _drop_privileges(config["uid"], config["gid"])
        if namespaces == "bwrap":
            os.execve(config["bwrap"], _bwrap_argv(config), config["env"])
        os.chdir(config["cwd"])
        os.execve(config["argv"][0], config["argv"], config["env"])
    except BaseException as exc:  # noqa: BLE001 - report anything, then leave
        try:
            os.write(error_pipe, f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")[:2000])
        finally:
            os._exit(127)


class _Supervisor:
    def __init__(self, config: dict):
        self.config = config
        self.uid = config["uid"]
        self.main: int | None = None
        self.status: int | None = None
        self.rusage = None
        self.peak = 0
        self.over_process_limit = False
        self.clean = True

    def run(self) -> dict:
        signals = {signal.SIGCHLD, STOP, STOP_NOW, signal.SIGINT, signal.SIGHUP}
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        _prctl(_PR_SET_PDEATHSIG, STOP)  # the harness died: stop the script as if asked to
        if os.getppid() != self.config["parent"]:
            return {"error": "the harness went away before the script started"}
        error_r, error_w = os.pipe()  # close-on-exec: EOF means the exec succeeded
        namespaces = self.config["namespaces"]
        if namespaces == "unshare":  # the init's host pid, then the script's wait status
            init_r, self.config["init_pid_fd"] = os.pipe()
            self.script_status_r, self.config["script_status_fd"] = os.pipe()
        elif namespaces == "bwrap":  # bubblewrap says here when the sandbox is up (and the script started)
            self.script_status_r, self.config["bwrap_status_fd"] = os.pipe()
        pid = os.fork()
        if pid == 0:
            _become_script(self.config, error_w)
        os.close(error_w)
        self.main = pid
        if namespaces == "unshare":
            os.close(self.config["init_pid_fd"])
            os.close(self.config["script_status_fd"])
            raw = _read_all(init_r)
            if len(raw) == 4:
                self.main = int.from_bytes(raw, "little")
        elif namespaces == "bwrap":
            os.close(self.config["bwrap_status_fd"])
        error = b""
        while chunk := os.read(error_r, 4096):
            error += chunk
        os.close(error_r)
        if error:
            self._kill_all()
            return {"error": error.decode("utf-8", "replace")}
        self._watch(signals)
        self._kill_all()
        return self._report()

    def _reap(self) -> bool:
        """Collect every exited child; True while any child remains."""
        while True:
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.main:
                self.status, self.rusage = status, rusage

    def _watch(self, signals) -> None:
        config = self.config
        stop_at = None
        next_count = 0.0
        while True:
            self._reap()
            if self.status is not None:
                return  # the script ended: whatever it left behind goes too, at once
            now = time.monotonic()
            if stop_at is not None and now - stop_at >= config["grace"]:
                return
            if config["watchdog"] and now >= next_count:  # no hard bound on processes here
                next_count = now + 0.05
                count = len(descendants(os.getpid()))
                self.peak = max(self.peak, count)
                if count > config["processes"] + config["helpers"]:
                    self.over_process_limit = True
                    return
            info = signal.sigtimedwait(signals, 0.05)
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            if info.si_signo == STOP and stop_at is None:
                stop_at = time.monotonic()
                tree = descendants(os.getpid())
                self.peak = max(self.peak, len(tree))  # at the bound, the bound was hit
                _kill(tree, signal.SIGTERM)
            elif info.si_signo != STOP:
                return

    def _kill_uid(self) -> None:
        pid = os.fork()
        if pid == 0:  # as the script's uid, kill(-1) reaches every process it started, and only those
            try:
                os.setgroups([])
                os.setgid(self.config["gid"])
                os.setuid(self.uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    def _kill_all(self) -> None:
        """SIGKILL everything the script started, until nothing is left. The cheap ways first (the
        cgroup's member list, kill(-1) as the script's uid); a walk of /proc when there is neither,
        and from the second round on."""
        deadline = time.monotonic() + _KILL_BUDGET
        cgroups = self.config["cgroups"]
        rounds = 0
        while True:
            children = self._reap()
            members = _cgroup_members(cgroups)
            if not children and not members:
                return  # a subreaper without children has no descendants left
            if time.monotonic() > deadline:
                self.clean = False
                return
            if rounds or not (cgroups or self.uid is not None):
                members |= set(descendants(os.getpid()))
            elif self.uid is not None:  # what it left at its end, and itself: at the bound, the bound was hit
                self.peak = max(self.peak, len(processes_of_uid(self.uid)) + (self.status is not None))
            _kill(members, signal.SIGKILL)
            if self.uid is not None:
                self._kill_uid()
            rounds += 1
            signal.sigtimedwait({signal.SIGCHLD}, 0.01)

    def _script_status(self) -> str:
        """In a namespace, the main child is a helper: replace its wait status by the script's.
        '' when that worked (or there is no helper), else why the sandbox could not be set up."""
        namespaces = self.config["namespaces"]
        if not namespaces:
            return ""
        raw = _read_all(self.script_status_r, blocking=False)
        if namespaces == "unshare":
            if len(raw) == 4:
                self.status = int.from_bytes(raw, "little")
            elif os.WIFEXITED(self.status):  # the init died before it could tell
                self.status = signal.SIGKILL
            return ""
        if b"child-pid" not in raw:  # it never started the script: by its own failure, or stopped first
            if os.WIFEXITED(self.status):
                return f"bubblewrap could not set up the sandbox (exit status {os.WEXITSTATUS(self.status)})"
            return ""
        if os.WIFEXITED(self.status) and 128 < os.WEXITSTATUS(self.status) < 128 + 65:
            self.status = os.WEXITSTATUS(self.status) - 128  # 128+N: the script died of signal N
        return ""

    def _report(self) -> dict:
        report = {"error": None, "exit_code": None, "signal": None, "cpu": None, "maxrss_kb": None,
                  "over_process_limit": self.over_process_limit, "peak_processes": self.peak or None,
                  "clean": self.clean}
        if self.status is not None:
            problem = self._script_status()
            if problem:
                return {"error": problem, "clean": self.clean}
            if os.WIFEXITED(self.status):
                report["exit_code"] = os.WEXITSTATUS(self.status)
            elif os.WIFSIGNALED(self.status):
                report["signal"] = os.WTERMSIG(self.status)
            report["cpu"] = self.rusage.ru_utime + self.rusage.ru_stime
            report["maxrss_kb"] = self.rusage.ru_maxrss
        for path in self.config["cgroups"]:
            try:
                with open(os.path.join(path, "pids.events")) as f:
                    for line in f:
                        if line.split()[:1] == ["max"] and int(line.split()[1]) > 0:
                            report["over_process_limit"] = True
                with open(os.path.join(path, "pids.peak")) as f:
                    report["peak_processes"] = int(f.read())
            except (OSError, ValueError, IndexError):
                pass
        if report["peak_processes"]:  # bubblewrap or the init is no process of the script's
            report["peak_processes"] = max(1, report["peak_processes"] - self.config["helpers"])
        # RLIMIT_NPROC refuses a fork before the cgroup is asked: reaching the bound is the sign
        if (report["peak_processes"] or 0) >= self.config["processes"]:
            report["over_process_limit"] = True
        return report


def _read_all(fd: int, blocking: bool = True) -> bytes:
    """What `fd` holds, then close it; not blocking: only what is there already."""
    os.set_blocking(fd, blocking)
    data = b""
    try:
        while chunk := os.read(fd, 4096):
            data += chunk
    except BlockingIOError:
        pass
    os.close(fd)
    return data


def main(argv: list[str]) -> int:
    """`argv[-1]`: the pipe the harness writes the (marshalled) config to."""
    data = b""
    with open(int(argv[-1]), "rb") as config_pipe:
        while chunk := config_pipe.read():
            data += chunk
    config = marshal.loads(data)
    try:
        report = _Supervisor(config).run()
    except BaseException as exc:  # noqa: BLE001 - the harness must learn why, not guess
        report = {"error": f"supervisor: {type(exc).__name__}: {exc}"}
    os.write(config["status_fd"], marshal.dumps(report))
    os._exit(0)  # nothing to tidy up: skip the interpreter's teardown
