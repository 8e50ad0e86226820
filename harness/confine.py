"""How the forked child of a learner run's supervisor contains itself before it becomes the script.

Its own session and pids cgroup, resource limits, no capabilities, no_new_privs, as root a fresh
unprivileged uid; where the machine allows, namespaces of its own, through bubblewrap
(`_bwrap_argv`) or unshare(2) and an init of its own (`_enter_namespaces`, `_build_root`, `_init`)
laying out the harness's mount plan (retrylab.mountplan); otherwise, if the interpreter sits where
that uid cannot enter, a private mount namespace exposing just what it needs (`_expose`).

Imported by supervisor.py (see there), in its own process and as a top-level module: it may import
only cheap standard modules (ctypes lazily).
"""
from __future__ import annotations

import os
import resource
import signal
import stat

PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
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
# In a supervisor forked from the warm learner template (retrylab.learner_template): that module, whose
# `present` and `run` replace the exec of a cold interpreter when config["in_process"] is set.
in_process = None

_libc = None


def libc():
    """The C library, loaded on first use (ctypes costs an import that a run without namespaces need not pay)."""
    global _libc
    if _libc is None:
        import ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def prctl(option: int, arg: int = 0) -> None:
    import ctypes
    if libc().prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")



def _expose(groups) -> None:
    """In a new mount namespace, cover each directory others cannot enter with an empty tmpfs that
    holds only the paths the script needs under it (bind mounts of the real ones)."""
    import ctypes
    c = libc()

    def mount(source, target, fstype, flags, data):
        if c.mount(source, target, fstype, ctypes.c_ulong(flags), data) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"mount {target!r}: {os.strerror(errno)}")

    if c.unshare(_CLONE_NEWNS) != 0:
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
    if libc().capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    if data[0].inheritable or data[1].inheritable:
        data[0].inheritable = data[1].inheritable = 0
        if libc().capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capset")


def _drop_privileges(uid: int | None, gid: int | None) -> None:
    prctl(_PR_SET_NO_NEW_PRIVS, 1)  # setuid programs (su, sudo) cannot give anything back
    if os.geteuid() != 0:
        return
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):  # an empty bounding set: even uid 0 gets no capability at exec
        prctl(_PR_CAPBSET_DROP, cap)
    try:
        prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
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
    if libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
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
        _syscall_ok(libc().unshare(flags), "unshare")
        return
    uid, gid = os.geteuid(), os.getegid()
    _syscall_ok(libc().unshare(flags | _CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
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
    _syscall_ok(libc().syscall(number, b".", b"."), "pivot_root")  # the old root now lies beneath the new
    _syscall_ok(libc().umount2(b".", _MNT_DETACH), "umount old root")
    _mount(None, "/", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.chdir("/")


def _init(config: dict, handles: dict[str, int], error_pipe: int) -> None:
    """PID 1 of the run's PID namespace: build its root, run the script, reap orphans, and pass
    the script's wait status to the supervisor. Never returns."""
    try:
        os.close(config["init_pid_fd"])  # the supervisor waits for its EOF before it watches the run
        libc().sethostname(b"retrylab", 8)
        _build_root(config["mounts"], handles)
        for which, soft, hard in config["rlimits"]:
            resource.setrlimit(which, (soft, hard))
        _present(config)
        _drop_privileges(config["uid"], config["gid"])
        script = os.fork()
        if script == 0:
            _start_script(config, error_pipe)
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


def _warm(config: dict) -> bool:
    return bool(config.get("in_process")) and in_process is not None


def _present(config: dict) -> None:
    if _warm(config):
        in_process.present(config)


def _start_script(config: dict, error_pipe: int) -> None:
    """Become the learner's script: exec a cold interpreter, or run it here (a warm template's fork)."""
    os.chdir(config["cwd"])
    if _warm(config):
        in_process.run(config, error_pipe)
    os.execve(config["argv"][0], config["argv"], config["env"])


def become_script(config: dict, error_pipe: int) -> None:
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
        if namespaces != "bwrap":
            _present(config)
        _drop_privileges(config["uid"], config["gid"])
        if namespaces == "bwrap":
            os.execve(config["bwrap"], _bwrap_argv(config), config["env"])
        _start_script(config, error_pipe)
    except BaseException as exc:  # noqa: BLE001 - report anything, then leave
        try:
            os.write(error_pipe, f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")[:2000])
        finally:
            os._exit(127)
