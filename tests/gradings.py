"""One grading per corpus entry (or reference solution) and backend, shared by every test that reads it.

An exercise's corpus test grades each entry for its verdict on every step, and the tests of the exercise's
areas assert what the same entries' messages say: each grading its own, the same entries were graded twice,
most of the suite's time. Here a grading is made once per test process and kept for the session.

Under pytest-xdist the tests sharing a grading must run in one worker: each carries the grading's
`xdist_group` mark (`params`, `reference_params`, `reference_group`), which `--dist loadgroup` (the README's
test command) honours; under another --dist a worker grades what it was not given a grading of, as before.

Imported as `gradings` (pytest puts tests/ on sys.path); the `shared_gradings` fixture (conftest.py) is
the session's instance.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from retrylab.corpus import CorpusEntry
from retrylab.grading import grade
from retrylab.results import Report

DEFAULT = "default"   # the exercise's default backend: how grade() is called without one


def group(exercise: str, name: str, backend: str | None) -> str:
    """The xdist group of the tests reading one grading ('@' and ']' would cut xdist's node id)."""
    return f"{exercise}/{name}/{backend or DEFAULT}"


def params(exercise: str, entries: list[CorpusEntry], backends: list[str] | None = None) -> list:
    """Parameters for a test reading these entries' gradings: `entry` alone (the default backend) when
    `backends` is None, else `(entry, backend)` for each backend; ids "kind/name" or "kind/name-backend"."""
    if backends is None:
        return [pytest.param(e, id=e.id, marks=pytest.mark.xdist_group(group(exercise, e.id, None)))
                for e in entries]
    return [pytest.param(e, b, id=f"{e.id}-{b}", marks=pytest.mark.xdist_group(group(exercise, e.id, b)))
            for b in backends for e in entries]


def reference_group(exercise: str, backend: str | None = None) -> pytest.MarkDecorator:
    """The mark of a test reading the reference solution's grading on `backend`."""
    return pytest.mark.xdist_group(group(exercise, "reference", backend))


def reference_params(exercise: str, backends: list[str]) -> list:
    """Parameters `backend` for a test reading the reference solution's grading on each backend."""
    return [pytest.param(b, id=b, marks=reference_group(exercise, b)) for b in backends]


class Gradings:
    """Full gradings (every step and advanced check, in English), each made on first use."""

    def __init__(self, folder: Path):
        self._folder = folder         # where entries are materialized, one folder per grading
        self._reports: dict[tuple, Report] = {}

    def entry(self, exercise: str, entry: CorpusEntry, backend: str | None = None) -> Report:
        key = (exercise, entry.id, backend)
        if key not in self._reports:
            where = self._folder / f"{exercise}-{entry.kind}-{entry.name}-{backend or DEFAULT}"
            self._reports[key] = grade(entry.materialize(where / "submission"), backend=backend,
                                       exercise_id=exercise)
        return self._reports[key]

    def reference(self, exercise: str, reference: Path, backend: str | None = None) -> Report:
        key = (exercise, "reference", backend)
        if key not in self._reports:
            self._reports[key] = grade(reference, backend=backend, exercise_id=exercise)
        return self._reports[key]
