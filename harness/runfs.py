"""A learner run's folder on a filesystem of its own: what the run may write, bounded in total.

RLIMIT_FSIZE bounds each file a learner's script writes, not how many it writes. Its copy of the submission, its
home and its temporary folder are all in the run's folder (sandbox.Sandbox), so a script could write file after
file there until the machine's disk is full, or create empty files until no inode is left, and every other
grading on the machine would fail with it. Where the harness may mount (root with CAP_SYS_ADMIN), the run's
folder is a tmpfs of `size` bytes and `files` inodes: the script meets ENOSPC there and nothing else does, and
unmounting drops everything the run left at once. Elsewhere (a learner's own machine, a container without
CAP_SYS_ADMIN) `mount_bounded` says no and the folder stays on the temporary directory's filesystem, as before.

A tmpfs holds its files in memory: `size` is a bound, not a reservation; a run that writes nothing costs nothing.
"""
from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

from retrylab.confine import libc

_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2


def mount_bounded(folder: Path, size: int, files: int, mode: int = 0o711) -> bool:
    """Mount a tmpfs of `size` bytes and `files` inodes on the empty `folder`; False where this process may not."""
    if os.geteuid() != 0:
        return False
    options = f"size={size},nr_inodes={files},mode={mode:o}".encode()
    return libc().mount(b"tmpfs", os.fsencode(folder), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) == 0


def unmount(folder: Path) -> bool:
    """Detach the tmpfs on `folder` (lazily: a process still in it cannot keep it mounted); whether one was."""
    return libc().umount2(os.fsencode(folder), _MNT_DETACH) == 0


def full(folder: Path) -> bool:
    """Whether the filesystem of `folder` has no block or no inode left for an unprivileged writer."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return False
    return stats.f_bavail == 0 or stats.f_favail == 0


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this process may give a run's folder a tmpfs of its own: tried once, for real, in a folder of its own."""
    probe = Path(tempfile.mkdtemp(prefix="retrylab-runfs-probe-"))
    try:
        return mount_bounded(probe, 1 << 20, 16) and unmount(probe)
    finally:
        probe.rmdir()
