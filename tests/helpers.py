"""Helpers shared by the harness's tests (imported as `helpers`: pytest puts tests/ on sys.path)."""
from __future__ import annotations

import signal
import socket
import time
from typing import Callable, TypeVar

import pytest

T = TypeVar("T")

WAIT = 15.0  # hang guard for a wait: generous, never a performance limit


def wait_until(predicate: Callable[[], T], what: str, timeout: float = WAIT, interval: float = 0.005) -> T:
    """Poll `predicate` until it returns something true, and return that; fail the test, naming
    `what` it waited for, after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout:g} s waiting for {what}")
        time.sleep(interval)
    return value


def scripts_folder(tmp_path, **scripts: str):
    """A submission folder `tmp_path/submission` holding `<name>.py` for each script (its code dedented)."""
    import textwrap
    folder = tmp_path / "submission"
    folder.mkdir()
    for name, code in scripts.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(code))
    return folder


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is no zombie. /proc can vanish between open and read (ESRCH):
    that too is gone."""
    from retrylab import procfs
    fields = procfs.stat_fields(pid)
    return fields is not None and fields[0] != b"Z"


def resp(*args) -> bytes:
    """One command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        arg = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


def recv_until_eof(sock: socket.socket) -> bytes:
    """Everything `sock` receives until its peer closes (or resets) the connection."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def default_sigint() -> None:
    """A subprocess's preexec_fn: SIGINT at its default, as a terminal starts a command. A shell starts background
    jobs with SIGINT ignored (CI scripts run so), the test process then inherits that, and a Python child would
    never raise KeyboardInterrupt: a test of what Ctrl-C does would wait for nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
