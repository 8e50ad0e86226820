"""What `containment.detect` measured, kept for a while so a learner's next `retrylab check` does not
measure it again.

Measuring starts a learner process in each way the machine might allow (about half a second), and a
learner re-runs the grader every minute. The measurement is kept in the user's cache folder
(`$XDG_CACHE_HOME/retrylab`, else `~/.cache/retrylab`) for CACHE_SECONDS, under a key made of
everything it depends on: the harness version and its modules that carry a run out, the interpreter,
the user, the learner client libraries (and where they are installed), RETRYLAB_NAMESPACES, the
bubblewrap executable, the kernel and this boot, the user-namespace settings, and the cgroup the grader
runs in. Any of those changing is another key, so another measurement.

A cached answer is believed only from a folder and a file that this user owns and no one else may write
(learner code never runs as this user with that folder visible: it runs as another uid, or in
namespaces that do not show it); anything else (missing, old, foreign, unreadable, garbage) is measured
again. A measurement in which a stronger way failed only for a transient reason (its probe timed out, was killed,
or met a machine out of processes, memory or descriptors: Containment.transient) is not kept.
RETRYLAB_CONTAINMENT_CACHE=0 measures every time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from retrylab import __version__, warmstart
from retrylab.containment import NAMESPACES_VARIABLE, Containment

CACHE_SECONDS = 900.0
CACHE_VARIABLE = "RETRYLAB_CONTAINMENT_CACHE"   # "0": no cache
_SETTINGS = ("/proc/sys/kernel/random/boot_id", "/proc/sys/kernel/unprivileged_userns_clone",
             "/proc/sys/user/max_user_namespaces", "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
             "/proc/self/cgroup")


def cached(learner_imports: tuple[str, ...], measure: Callable[[], Containment]) -> Containment:
    """The containment kept for this machine's present state, else `measure()` (then kept)."""
    if os.environ.get(CACHE_VARIABLE, "").strip() == "0":
        return measure()
    path = folder() / f"containment-{key(learner_imports)}.json"
    found = _read(path)
    if found is not None:
        return found
    measured = measure()
    if not measured.transient:          # a weaker answer from a busy moment is measured again next time
        _write(path, measured)
    return measured


def folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "retrylab"


# The harness's modules that carry a learner process out, whose answer is measured: an edited one (a working
# copy of the harness, its version unchanged) is measured again instead of believed from the old code's answer.
_HERE = Path(__file__).resolve().parent
_MEASURING_CODE = ("containment.py", "sandbox.py", "supervisor.py", "confine.py", "mountplan.py", "procfs.py",
                   "cgroups.py", "learner_template.py", "warmstart.py")


def key(learner_imports: tuple[str, ...]) -> str:
    """A digest of everything the measurement depends on."""
    bwrap = shutil.which("bwrap") or ""
    facts = {
        "harness": __version__, "python": [sys.executable, sys.version], "uid": os.geteuid(),
        "imports": {name: _origin(name) for name in learner_imports},
        "namespaces": os.environ.get(NAMESPACES_VARIABLE, ""), "warm": warmstart.enabled(),
        "bwrap": [bwrap, _stamp(bwrap)], "kernel": os.uname().release,
        "settings": {path: _text(path) for path in _SETTINGS},
        "code": {name: _stamp(str(_HERE / name)) for name in _MEASURING_CODE},
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def _origin(module: str) -> list:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    origin = (spec.origin or "") if spec else ""
    return [origin, _stamp(origin)]


def _stamp(path: str) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return []
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _trusted(st: os.stat_result) -> bool:
    """Owned by this user, and writable by no one else."""
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _read(path: Path) -> Containment | None:
    try:
        if not _trusted(os.stat(path.parent)):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _trusted(st) or time.time() - st.st_mtime > CACHE_SECONDS:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = json.loads(f.read(1 << 16))
        return Containment(unprivileged_uid=bool(data["unprivileged_uid"]),
                           cgroups=tuple(str(c) for c in data["cgroups"]),
                           notes=tuple(str(n) for n in data["notes"]),
                           namespaces=str(data["namespaces"]), bwrap=str(data["bwrap"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


def _write(path: Path, containment: Containment) -> None:
    """Keep the measurement; a cache that cannot be written is no cache (the grading goes on)."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not _trusted(os.stat(path.parent)):
            return
        fd, tmp = tempfile.mkstemp(prefix=".containment-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(dataclasses.asdict(containment), f)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
