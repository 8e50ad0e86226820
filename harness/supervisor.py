"""The supervisor of one learner run: a process between the harness and the learner's script.

It is a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so whatever the script starts, even a daemon
that double-forks and calls setsid, stays its descendant. It forks the script's process (own
session, pids cgroup, resource limits, no capabilities, no_new_privs, as root a fresh unprivileged
uid), and, where the machine allows, its own namespaces (mount, network, IPC, PID, UTS: see
"Namespaces" below and confine.py; otherwise, if the interpreter sits where that uid cannot enter, a
private mount namespace exposing just what it needs), then waits: when the script exits, or the harness asks it to stop (SIGTERM:
SIGTERM to every descendant, SIGKILL after a grace period; SIGUSR1: SIGKILL at once), it kills
every descendant and reports how the script ended and which limits it hit.

It starts for every learner run, so it imports only cheap standard modules (ctypes lazily) and is
started as `python -I -S -B -c "import supervisor ..."` from its compiled file: its config comes
marshalled on a pipe (not in argv, which anyone can read in /proc), its report goes back on another.
With the harness's folder as its path it imports confine, procfs and cgroups as top-level modules,
which therefore import only standard ones. Used from the harness by retrylab.sandbox.

Namespaces (config["namespaces"]): the script sees only the filesystem the harness's mount plan
lists (config["mounts"], see retrylab.mountplan), a fresh /proc, private scratch tmpfs, and a network
namespace with no route out (its broker is a unix socket in the run's folder).
- "bwrap": the forked child, after rlimits and dropping to the run's uid, execs bubblewrap, which
  makes an unprivileged user namespace and the rest, then execs the interpreter. Directories the
  run's uid cannot enter on the way to a bind source (a pyenv under /root) are exposed first, as
  without namespaces (`confine._expose`). bubblewrap reports a death by signal N as exit status 128+N; the
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
import signal
import time

if __package__:  # imported by the harness, as retrylab.supervisor (for its signals and `kill`)
    from retrylab import cgroups, confine, procfs
else:            # its own process: started with the harness's folder as its sys.path[0]
    import cgroups
    import confine
    import procfs

STOP = signal.SIGTERM        # harness -> supervisor: stop the script (SIGTERM it, SIGKILL after grace)
STOP_NOW = signal.SIGUSR1    # harness -> supervisor: kill everything at once (the harness was interrupted)
KILL_BUDGET = 5.0            # seconds the supervisor keeps killing before it reports failure
MEMORY_LOOK = 0.2            # seconds between two counts of the memory the script's processes hold together


def kill(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass



class _Supervisor:
    def __init__(self, config: dict, lifeline: int | None = None):
        self.config = config
        self.lifeline = lifeline
        self.uid = config["uid"]
        self.main: int | None = None
        self.status: int | None = None
        self.rusage = None
        self.peak = 0
        self.over_process_limit = False
        self.over_memory_limit = False
        self.clean = True

    def run(self) -> dict:
        signals = {signal.SIGCHLD, STOP, STOP_NOW, signal.SIGINT, signal.SIGHUP}
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        confine.prctl(confine.PR_SET_CHILD_SUBREAPER, 1)
        confine.prctl(confine.PR_SET_PDEATHSIG, STOP)  # the harness died: stop the script as if asked to
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
            confine.become_script(self.config, error_w)
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
        next_count = next_memory = 0.0
        while True:
            self._reap()
            if self.status is not None:
                return  # the script ended: whatever it left behind goes too, at once
            now = time.monotonic()
            if stop_at is not None and now - stop_at >= config["grace"]:
                return
            if config["watchdog"] and now >= next_count:  # no hard bound on processes here
                next_count = now + 0.05
                count = len(procfs.descendants(os.getpid()))
                self.peak = max(self.peak, count)
                if count > config["processes"] + config["helpers"]:
                    self.over_process_limit = True
                    return
            if now >= next_memory:  # the whole run's memory, which no rlimit bounds (procfs.memory_below)
                next_memory = now + MEMORY_LOOK
                if procfs.memory_below(os.getpid()) > config["memory"]:
                    self.over_memory_limit = True
                    return
            if self.lifeline is not None and _closed(self.lifeline):
                self.lifeline = None
                os.kill(os.getpid(), STOP)  # the harness died: stop the script as if asked to (PDEATHSIG's job)
            info = signal.sigtimedwait(signals, 0.05)
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            if info.si_signo == STOP and stop_at is None:
                stop_at = time.monotonic()
                tree = procfs.descendants(os.getpid())
                self.peak = max(self.peak, len(tree))  # at the bound, the bound was hit
                kill(tree, signal.SIGTERM)
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
        deadline = time.monotonic() + KILL_BUDGET
        groups = self.config["cgroups"]
        rounds = 0
        while True:
            children = self._reap()
            members = cgroups.members(groups)
            if not children and not members:
                return  # a subreaper without children has no descendants left
            if time.monotonic() > deadline:
                self.clean = False
                return
            if rounds or not (groups or self.uid is not None):
                members |= set(procfs.descendants(os.getpid()))
            elif self.uid is not None:  # what it left at its end, and itself: at the bound, the bound was hit
                self.peak = max(self.peak, len(procfs.processes_of_uid(self.uid)) + (self.status is not None))
            kill(members, signal.SIGKILL)
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
                  "over_process_limit": self.over_process_limit, "over_memory_limit": self.over_memory_limit,
                  "peak_processes": self.peak or None,
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


def _closed(fd: int) -> bool:
    """Whether the other end of pipe `fd` is closed (nothing is ever written to it)."""
    import select
    return bool(select.select([fd], [], [], 0)[0])


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


def main(argv: list[str], status_fd: int | None = None, lifeline: int | None = None) -> int:
    """`argv[-1]`: the pipe the harness writes the (marshalled) config to. A supervisor forked by the warm
    learner template (retrylab.learner_template) also gets `status_fd`, where the report goes (the config names
    the harness's number for it), and `lifeline`, a pipe the harness holds the other end of: its parent is the
    template, so its parent-death signal does not say the harness died; the lifeline's EOF does."""
    data = b""
    with open(int(argv[-1]), "rb") as config_pipe:
        while chunk := config_pipe.read():
            data += chunk
    config = marshal.loads(data)
    if status_fd is not None:
        config["status_fd"] = status_fd
    try:
        report = _Supervisor(config, lifeline).run()
    except BaseException as exc:  # noqa: BLE001 - the harness must learn why, not guess
        report = {"error": f"supervisor: {type(exc).__name__}: {exc}"}
    os.write(config["status_fd"], marshal.dumps(report))
    os._exit(0)  # nothing to tidy up: skip the interpreter's teardown
