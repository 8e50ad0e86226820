"""The throw-away copy of a submission a learner run works in, and what a run's uid leaves elsewhere.

The copy holds regular files and symlinks only (a FIFO or a device would block or leak the copy; a
link to a harness file must not be copied in as the file itself) and, for a run with a uid of its own,
belongs to that uid. Without namespaces of its own, what that uid left in the machine's shared scratch
folders and SysV IPC is removed after the run (`remove_leftovers`).
"""
from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from retrylab.tempdirs import remove_tree

_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # writable by anyone


class NotCopied(Exception):
    """A file of the submission could not be copied for the run: `file` (as the submission names it), the system
    error number behind it and its reason."""

    def __init__(self, file: str, errno_: int | None, reason: str):
        super().__init__(f"{file}: {reason}")
        self.file, self.errno, self.reason = file, errno_, reason


def copy_submission(submission: Path, workdir: Path) -> None:
    try:
        shutil.copytree(submission, workdir, symlinks=True, copy_function=_copy_regular,
                        ignore=shutil.ignore_patterns("__pycache__", ".git"))
    except shutil.Error as exc:     # copytree copies what it can, then lists what it could not: the first says why
        file, _, why = exc.args[0][0]
        found = re.search(r"\[Errno (\d+)\] ([^:]*)", why)
        raise NotCopied(_named(file, submission), int(found.group(1)) if found else None,
                        found.group(2) if found else why) from None
    except OSError as exc:          # the submission's folder itself could not be listed
        raise NotCopied(_named(exc.filename or submission, submission), exc.errno, exc.strerror or str(exc)) from None


def _named(path, submission: Path) -> str:
    try:
        return str(Path(path).relative_to(submission)) if Path(path) != submission else "."
    except ValueError:
        return str(path)


def _copy_regular(src: str, dst: str) -> None:
    """Copy regular files only: a FIFO or a device in a submission would block or leak the copy."""
    if stat.S_ISREG(os.lstat(src).st_mode):
        shutil.copy2(src, dst)


def chown_tree(top: Path, uid: int, gid: int) -> None:
    os.chown(top, uid, gid, follow_symlinks=False)
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


def remove_leftovers(uid: int) -> None:
    """Remove what `uid` left in the shared scratch folders and its SysV IPC objects."""
    for folder in _SCRATCH:
        _remove_owned(folder, uid)
    _remove_ipc_of(uid)


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
                remove_tree(Path(entry.path))
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
