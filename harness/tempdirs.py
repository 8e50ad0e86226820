"""The harness's temporary folders, named after the process that made them.

A grading removes its folders as it ends, also when interrupted; one killed outright (SIGKILL, the
OOM killer, a CI job's timeout) runs no code of its own, and its folders (a copy of a submission,
a private server's) would stay for good. Each folder's name carries its maker's pid, so the next
grading on the machine removes those whose maker is gone (`sweep_stale`).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from retrylab import runfs

__all__ = ["make", "remove_tree", "sweep_stale"]

_NAME = re.compile(r"retrylab-[a-z]+-(\d+)-")


def make(kind: str) -> Path:
    """A new folder `retrylab-<kind>-<pid>-<random>` in the temporary directory (mode 0700)."""
    return Path(tempfile.mkdtemp(prefix=f"retrylab-{kind}-{os.getpid()}-"))


def remove_tree(top: Path | None) -> None:
    """Remove a folder whatever a learner's script did to it (read-only files, chmod 000 folders). An interrupt
    (Ctrl-C, or SIGTERM, which the CLI raises as one) that lands midway is held until the folder is gone, then
    raised: cut short, the removal would leave a half-removed folder, or a run's tmpfs mounted, behind the grading
    (a test's private TMPDIR once kept one). A third interrupt is let through at once."""
    interrupted = None
    for _ in range(3):
        try:
            _remove(top)
            break
        except KeyboardInterrupt as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def _remove(top: Path | None) -> None:
    if top is None or not os.path.lexists(top):
        return
    if os.path.ismount(top):    # a run's folder on a tmpfs of its own (runfs): its files go with it
        runfs.unmount(top)
    shutil.rmtree(top, ignore_errors=True)
    if not os.path.lexists(top):
        return
    stack = [str(top)]  # make every folder ours to list and change again, then remove once more
    while stack:
        folder = stack.pop()
        try:
            os.chmod(folder, 0o700)
            entries = list(os.scandir(folder))
        except OSError:
            continue
        stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
    shutil.rmtree(top, ignore_errors=True)


def sweep_stale(top: str | None = None) -> int:
    """Remove the folders (never what a link points to) whose maker process is gone; how many."""
    removed = 0
    try:
        entries = list(os.scandir(top or tempfile.gettempdir()))
    except OSError:
        return 0
    for entry in entries:
        match = _NAME.match(entry.name)
        if match and entry.is_dir(follow_symlinks=False) and not _alive(int(match.group(1))):
            remove_tree(Path(entry.path))
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:     # EPERM: it exists, as another user
        return True
    return True
