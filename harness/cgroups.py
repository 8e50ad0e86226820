"""A pids cgroup per learner run: where one can be made here, making and removing it, its members.

A cgroup bounds how many processes a run may have at once, and says when the bound was hit. It is
used where a run has no uid of its own (RLIMIT_NPROC bounds a uid's processes otherwise): cgroup v2
if it offers the pids controller, else v1's pids hierarchy.

The supervisor of a learner run (supervisor.py) imports this module as a top-level `cgroups` from its
own folder: it may import only cheap standard modules.
"""
from __future__ import annotations

import os
import time


def usable() -> tuple[str, ...]:
    """Directories where a per-run cgroup with a pids.max can be made. Tried once, for real."""
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
        probe = os.path.join(parent, f"retrylab-probe-{os.getpid()}-{os.urandom(3).hex()}")
        if _new(probe, 10):
            remove(probe)
            return (parent,)
    return ()


def make(parents: tuple[str, ...], run_id: str, processes: int) -> str | None:
    """A new cgroup for run `run_id` under the first of `parents` that allows it, bounded to
    `processes`; None if none does."""
    for parent in parents:
        path = os.path.join(parent, f"retrylab-{run_id}")
        if _new(path, processes):
            return path
    return None


def _new(path: str, processes: int) -> bool:
    """Make the cgroup `path`, bounded to `processes`; False, and nothing left, where that fails."""
    try:
        os.mkdir(path)
    except OSError:
        return False
    try:
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(processes))
        return True
    except OSError:
        remove(path)
        return False


def remove(path: str) -> None:
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # a killed task can take a moment to leave


def members(paths) -> set[int]:
    """The processes in the cgroups at `paths`."""
    found = set()
    for path in paths:
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                found.update(int(line) for line in f if line.strip())
        except (OSError, ValueError):
            continue
    return found


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
