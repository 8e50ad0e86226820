"""One grading per corpus entry (or reference solution) and backend, shared by every test that reads it.

An exercise's corpus test grades each entry for its verdict on every step, and the tests of the exercise's
areas assert what the same entries' messages say: each grading its own, the same entries were graded twice,
most of the suite's time. Here a grading is made once per test session and read by all of them.

Under pytest-xdist the tests sharing a grading may run in different workers, in any order (pytest-randomly):
so a grading is kept in a folder all the session's workers share, as a pickled Report, and made under a
lock of its own, so that a worker asking for one another worker is making waits for it instead of making
it again. (xdist's `--dist loadgroup` would keep such tests in one worker, but with pytest 9 it groups
nothing: xdist 3.8 renames `item._nodeid`, which pytest 9 no longer reads.)

Imported as `gradings` (pytest puts tests/ on sys.path); the `shared_gradings` fixture (conftest.py) is
the session's instance.
"""
from __future__ import annotations

import fcntl
import os
import pickle
import re
from pathlib import Path

from retrylab.corpus import CorpusEntry
from retrylab.grading import grade
from retrylab.results import Report

DEFAULT = "default"   # the exercise's default backend: how grade() is called without one


def shared_folder(basetemp: Path) -> Path:
    """The session's folder every xdist worker sees: a worker's basetemp is `<session's>/popen-gwN`."""
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


class Gradings:
    """Full gradings (every step and advanced check, in English), each made on first use in the session."""

    def __init__(self, folder: Path):
        self._folder = folder
        self._reports: dict[str, Report] = {}    # this process's, read back once

    def entry(self, exercise: str, entry: CorpusEntry, backend: str | None = None) -> Report:
        return self._get(f"{exercise}-{entry.kind}-{entry.name}-{backend or DEFAULT}",
                         lambda where: grade(entry.materialize(where / "submission"), backend=backend,
                                             exercise_id=exercise))

    def reference(self, exercise: str, reference: Path, backend: str | None = None) -> Report:
        return self._get(f"{exercise}-reference-{backend or DEFAULT}",
                         lambda where: grade(reference, backend=backend, exercise_id=exercise))

    def _get(self, key: str, make) -> Report:
        if key not in self._reports:
            self._reports[key] = self._shared(re.sub(r"[^\w.-]", "_", key), make)
        return self._reports[key]

    def _shared(self, name: str, make) -> Report:
        where = self._folder / "shared-gradings" / name
        where.mkdir(parents=True, exist_ok=True)
        made = where / "report.pickle"
        with open(where / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)    # released when closed, also if make() raises (nothing kept)
            if made.is_file():
                return pickle.loads(made.read_bytes())
            report = make(where)
            partial = where / "report.pickle.partial"
            partial.write_bytes(pickle.dumps(report))
            partial.rename(made)
            return report
