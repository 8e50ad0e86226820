"""What of the machine's filesystem a learner's script gets to see, and how it reaches it.

In namespaces of its own (`mount_plan`): the system read-only, what Python and the learner's client
libraries need read-only, its run's folder, private scratch. As a fresh uid, directories it cannot
enter on the way there (a pyenv under /root) are exposed alone (`exposures`). supervisor.py carries
the plan out, or hands it to bubblewrap.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import site
import stat
import sys
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "learner_site" / "pythonpath"
# the learner site's own imports (its virtual clock): whatever the broker, a learner process reads them
ENGINE_IMPORTS = ("time_machine",)
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_SMALL_SCRATCH = 64 << 20   # bytes of tmpfs for /var/tmp, /run/lock, /dev/shm (memory: it is a tmpfs)


@functools.lru_cache(maxsize=1)
def needed_paths() -> frozenset[Path]:
    """Directories a learner process must reach: the interpreter, its libraries, the harness."""
    paths = {Path(sys.base_prefix), Path(sys.prefix), Path(os.path.realpath(sys.executable)).parent,
             Path(__file__).resolve().parent.parent, SITE_DIR}
    for entry in [*site.getsitepackages(), *sys.path]:
        if entry and os.path.isdir(entry):
            paths.add(Path(entry))
    return frozenset(p.resolve() for p in paths if p.exists())


def _module_root(name: str) -> str:
    """Where `name` is installed: the folder holding its package (or module file). Found, not imported: the
    grading never uses the virtual clock's library itself, and importing it (and the unittest it imports)
    cost every grading about 0.04 CPU-s."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not os.path.isabs(spec.origin):
        raise ModuleNotFoundError(f"no installed module named {name!r}", name=name)
    path = os.path.dirname(spec.origin)
    return os.path.dirname(path) if os.path.basename(spec.origin) == "__init__.py" else path


@functools.lru_cache(maxsize=8)
def learner_paths(learner_imports: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What a learner process reads besides the system: the interpreter's prefixes, its site-packages
    (the learner's client libraries, `learner_imports`, and the engine's virtual clock), and the
    harness's learner-side package. Of the harness only retrylab/__init__.py and
    retrylab/learner_site: an editable install maps `retrylab` to the repository's harness/ folder,
    and nothing else of the repository is the learner's to read."""
    package = Path(__file__).resolve().parent
    candidates = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)),
                  *site.getsitepackages(), *(_module_root(n) for n in (*learner_imports, *ENGINE_IMPORTS)),
                  str(package / "__init__.py"), str(package / "learner_site")]
    return outermost(Path(c).resolve() for c in candidates if c and os.path.exists(c))


def outermost(paths) -> tuple[str, ...]:
    """`paths` without those inside another one (a bind of the outer one shows them already)."""
    unique = sorted(set(paths), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in unique:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return tuple(str(p) for p in kept)


def mount_plan(root: Path, files, tmp_bytes: int, learner_imports: tuple[str, ...] = ()) -> list[tuple]:
    """The filesystem a script sees in its own mount namespace, in the order it is laid out
    (supervisor.py carries it out itself, or hands it to bubblewrap): a fresh /proc, a minimal
    /dev, private scratch tmpfs (/tmp of `tmp_bytes`), the system read-only, what Python needs
    read-only, the run's folder at the same path, and the files the environment names (e.g. the
    instrumented application module).
    ("ro"|"rw", source, target), ("tmpfs", target, bytes), ("symlink", link text, path), ("proc"|"dev", target)."""
    plan: list[tuple] = [("proc", "/proc"), ("dev", "/dev"), ("tmpfs", "/tmp", tmp_bytes)]
    plan += [("tmpfs", folder, _SMALL_SCRATCH) for folder in ("/var/tmp", "/run/lock", "/dev/shm")]
    binds: list[Path] = []
    for folder in _SYSTEM_DIRS:
        if os.path.islink(folder):
            plan.append(("symlink", os.readlink(folder), folder))
        elif os.path.isdir(folder):
            binds.append(Path(folder))
    shown = [Path(p) for p in outermost([*binds, *map(Path, learner_paths(learner_imports))])]
    plan += [("ro", str(p), str(p)) for p in shown]
    plan.append(("rw", str(root), str(root)))
    for path in sorted(files):
        if not any(s == path or s in path.parents for s in [*shown, root]):
            plan.append(("ro", str(path), str(path)))
    return plan


def exposures(paths) -> list[tuple[str, list[str]]]:
    """For each directory others cannot enter on the way to a needed path (e.g. /root, mode 0700):
    that directory and the needed paths below it, to be bind-mounted onto a tmpfs laid over it."""
    groups: dict[Path, set[Path]] = {}
    for path in paths:
        for ancestor in reversed(path.parents):  # from / down
            if ancestor == Path("/"):
                continue
            try:
                mode = ancestor.stat().st_mode
            except OSError:
                break
            if not mode & stat.S_IXOTH:
                groups.setdefault(ancestor, set()).add(path)
                break
    result = []
    for blocker, below in sorted(groups.items()):
        kept = sorted(p for p in below if not any(q != p and q in p.parents for q in below))
        result.append((str(blocker), [str(p) for p in kept]))
    return result
