"""The warm learner template: a clean interpreter with the learner side already imported, forked per run.

A learner run used to start two cold interpreters (the supervisor, then the script's) and import the broker's
client library and the virtual clock in the second: about 0.2 CPU-seconds before the script's first line, three
or more times per grading. The template pays that once per grading process. It is started by the harness
(retrylab.warmstart) with the environment every learner process starts with (none of the harness's), imports
the learner-side modules, and then only forks: for each run the harness hands it, over a unix socket, the run's
stdout, stderr, report and config pipes, and gets back the pid and a pidfd of a fresh child. That child becomes
the run's supervisor (retrylab.supervisor, unchanged: it reads its config from the pipe, so the template never
sees any run's config), and the supervisor's child contains itself as before (retrylab.confine: unshare(2)
namespaces, mount plan, rlimits, the run's uid), but instead of exec'ing an interpreter it runs the script in
the forked copy (`run_script`), with the run's environment, argv, cwd and learner site installed, and every
descriptor it did not open itself closed. bubblewrap has to exec what it contains, so runs contained by it
start cold; warm start uses direct unshare(2) (retrylab.containment prefers it then).

What a learner process can see of the template: modules imported (all of them importable by it anyway) and the
template's own empty state. The template holds no secret: its environment is the learner's allowlist, it never
reads a config, and it runs as root only to fork supervisors. It ends when the harness's end of the socket
closes (the harness exited or was killed), and so do its supervisors (their parent-death signal stops the run).
"""
from __future__ import annotations

import importlib
import os
import signal
import socket
import sys

_MAX_FD = 1 << 16


def serve(control_fd: int, preload: list[str]) -> None:
    """The template's main loop (its own process; see retrylab.warmstart for the other end)."""
    control = socket.socket(fileno=control_fd)
    base_path = list(sys.path)              # as a cold `python script.py` would have it, but for [0]
    # the learner side (client libraries, the engine's, the learner site) and the forked supervisor's code
    for name in (*preload, "ctypes", "retrylab.confine", "retrylab.supervisor", "retrylab.learner_site.app_loader",
                 "retrylab.learner_site.broker_redirect", "retrylab.learner_site.virtual_clock"):
        importlib.import_module(name)
    sys.modules["retrylab.learner_site.virtual_clock"].preload()
    signal.signal(signal.SIGCHLD, _reap)
    control.send(b"ready")
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 64, 5)
        except OSError:
            message, fds = b"", []
        if message[:3] != b"run" or len(message) != 11 or len(fds) != 5:
            for fd in fds:
                os.close(fd)
            os._exit(0)                     # EOF: the harness is gone (or talks nonsense)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # reaped only once its pidfd is open
        try:
            pid = os.fork()
            if pid == 0:
                _become_supervisor(fds, base_path)
            pidfd = os.pidfd_open(pid)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        for fd in fds:
            os.close(fd)
        socket.send_fds(control, [message[3:] + pid.to_bytes(4, "little")], [pidfd])  # the request's id first
        os.close(pidfd)


def _reap(*_) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _become_supervisor(fds: list[int], base_path: list[str]) -> None:
    """In the forked child: the run's supervisor, with only the run's descriptors. Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.setsid()
        stdout_w, stderr_w, status_w, config_r, lifeline = fds
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(stdout_w, 1)
        os.dup2(stderr_w, 2)
        keep = sorted({0, 1, 2, status_w, config_r, lifeline})
        _close_all_but(keep)
        from retrylab import confine, supervisor
        global _BASE_PATH
        _BASE_PATH = base_path
        confine.in_process = sys.modules[__name__]
        supervisor.main(["", str(config_r)], status_fd=status_w, lifeline=lifeline)
    except BaseException:  # noqa: BLE001 - on the run's stderr: the harness reports a run without a report
        import traceback
        os.write(2, f"retrylab: the warm supervisor failed:\n{traceback.format_exc()}".encode("utf-8", "replace"))
    os._exit(127)


def _close_all_but(keep: list[int]) -> None:
    low = 0
    for fd in sorted(keep):
        if fd > low:                    # closerange(n, n) would close everything from n up: not empty
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _MAX_FD)


_BASE_PATH: list[str] = []
_PR_SET_DUMPABLE = 4
ROOM = 16 << 10      # bytes of padding in the template's environment: room for a run's


def present(config: dict) -> None:
    """Before the script is forked: make /proc/<pid>/environ and /proc/<pid>/cmdline of this process and its
    children show the run's environment and argv, as they would after an exec. The harness finds a run's
    processes by the run id in their environment (a supervisor that failed, a test looking for leftovers).

    /proc shows the memory the first exec laid them out in; PR_SET_MM could move it, but needs CAP_SYS_RESOURCE,
    which a container's root often lacks. So they are written over in place: the template started with padding
    in its environment (ROOM), and the C environment no longer points into that block once os.environ is
    rebuilt. The argv block is the template's command line (~200 bytes): a longer argv is cut short there, a
    shorter one ends in empty strings (harmless: /proc's command lines are only shown, never relied upon)."""
    import ctypes
    os.environ.clear()
    os.environ.update(config["env"])
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    arg_start, arg_end, env_start, env_end = (int(v) for v in fields[45:49])  # fields 48-51 of proc(5)
    run_id = [f"{k}={v}" for k, v in config["env"].items() if k == "RETRYLAB_RUN_ID"]
    env = run_id + [f"{k}={v}" for k, v in config["env"].items() if k != "RETRYLAB_RUN_ID"]  # the id first
    for start, end, strings in ((arg_start, arg_end, config["argv"]), (env_start, env_end, env)):
        block = b"".join(os.fsencode(s) + b"\0" for s in strings)[:end - start]
        ctypes.memmove(start, block.ljust(end - start, b"\0"), end - start)


def run(config: dict, error_pipe: int) -> None:
    """In the forked script process (contained, as the run's uid, in its cwd): be `python <argv[1:]>` with
    config["env"] as the environment, as a cold interpreter would be. Never returns."""
    import builtins
    import time
    import types
    from importlib.machinery import SourceFileLoader
    argv = config["argv"]
    time.tzset()                            # os.environ is the run's already (present)
    path = os.path.abspath(argv[1])
    sys.argv = list(argv[1:])
    sys.path[:] = [os.path.dirname(path), *_BASE_PATH[1:]]
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None, __spec__=None,
                         __loader__=SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    _close_all_but([0, 1, 2, error_pipe])
    # a change of uid made this process non-dumpable (its /proc files root's); an exec would have undone that
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    import sitecustomize                    # the learner site, with this run's environment now
    sitecustomize._install()
    os.close(error_pipe)                    # EOF: the script has started (a cold run's exec does the same)
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        sys.stderr.write(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}\n")
        _finish(2)
    _finish(_execute(source, path, main.__dict__))


def _execute(source: bytes, path: str, namespace: dict):
    """Run the script; its exit status, or "SIGINT" when a KeyboardInterrupt ended it (as python does)."""
    try:
        exec(compile(source, path, "exec"), namespace)
    except SystemExit as exc:
        return _exit_status(exc)
    except BaseException as exc:  # noqa: BLE001 - printed as python prints it, without this frame
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        return "SIGINT" if isinstance(exc, KeyboardInterrupt) else 1
    return 0


def _exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def _finish(status) -> None:
    """What the interpreter does at its end: wait for non-daemon threads, run atexit, flush; then exit."""
    import atexit
    import threading
    try:
        threading._shutdown()
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    if status == "SIGINT":
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 130
    os._exit(status)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
