"""An exercise is data (exercise.toml: steps, titles, hints, weights, limits) plus check modules.

The engine reads exercises from the `checks` package; adding a lab means adding a folder there.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CHECKS_DIR = Path(__file__).resolve().parent.parent / "checks"
try:  # installed (non-editable): checks live inside the package
    import retrylab.checks as _checks_pkg
    CHECKS_DIR = Path(_checks_pkg.__file__).resolve().parent
except ImportError:  # pragma: no cover
    pass

DEFAULT_EXERCISE = "backoff-dlq"


@dataclass(frozen=True)
class Step:
    """A lab step (numbered) or an advanced check (number None; reported apart, worth 0 points)."""
    number: int | None
    slug: str
    title: str
    hint: str
    weight: float
    timeout: float
    file: str = ""   # the learner's file a failure points at (annotations), relative to the submission


@dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    folder: Path
    steps: tuple[Step, ...]
    advanced: tuple[Step, ...] = ()

    def step(self, number: int) -> Step:
        for step in self.steps:
            if step.number == number:
                return step
        raise KeyError(f"{self.id} has no step {number}")

    def check(self, key: int | str) -> Step:
        """A lab step by number, or an advanced check by id."""
        if isinstance(key, int):
            return self.step(key)
        for check in self.advanced:
            if check.slug == key:
                return check
        raise KeyError(f"{self.id} has no advanced check {key!r}")


class UnknownExercise(LookupError):
    pass


def _load(folder: Path) -> Exercise:
    meta = tomllib.loads((folder / "exercise.toml").read_text(encoding="utf-8"))
    defaults = meta.get("defaults", {})
    def make(entry: dict, number: int | None, slug: str, weight: float) -> Step:
        return Step(number=number, slug=slug, title=entry["title"], hint=entry["hint"], weight=weight,
                    timeout=float(entry.get("timeout", defaults.get("timeout", 20))),
                    file=str(entry.get("file", "")))

    steps = tuple(make(s, int(s["number"]), s["slug"], float(s.get("weight", defaults.get("weight", 1))))
                  for s in meta["steps"])
    advanced = tuple(make(a, None, a["id"], 0.0) for a in meta.get("advanced", ()))
    return Exercise(id=meta["id"], title=meta["title"], folder=folder, steps=steps, advanced=advanced)


@cache
def exercises() -> dict[str, Exercise]:
    found = {}
    for toml in sorted(CHECKS_DIR.glob("*/exercise.toml")):
        exercise = _load(toml.parent)
        found[exercise.id] = exercise
    return found


def get(exercise_id: str) -> Exercise:
    try:
        return exercises()[exercise_id]
    except KeyError:
        known = ", ".join(sorted(exercises())) or "none"
        raise UnknownExercise(f"unknown exercise {exercise_id!r} (known: {known})") from None


def for_path(path: Path) -> Exercise | None:
    """The exercise whose folder holds `path` (a check module), if any."""
    path = Path(path).resolve()
    for exercise in exercises().values():
        if exercise.folder.resolve() in path.parents:
            return exercise
    return None
