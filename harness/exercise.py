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
    number: int
    slug: str
    title: str
    hint: str
    weight: float
    timeout: float


@dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    folder: Path
    steps: tuple[Step, ...]

    def step(self, number: int) -> Step:
        for step in self.steps:
            if step.number == number:
                return step
        raise KeyError(f"{self.id} has no step {number}")


class UnknownExercise(LookupError):
    pass


def _load(folder: Path) -> Exercise:
    meta = tomllib.loads((folder / "exercise.toml").read_text(encoding="utf-8"))
    defaults = meta.get("defaults", {})
    steps = tuple(
        Step(number=int(s["number"]), slug=s["slug"], title=s["title"], hint=s["hint"],
             weight=float(s.get("weight", defaults.get("weight", 1))),
             timeout=float(s.get("timeout", defaults.get("timeout", 20))))
        for s in meta["steps"])
    return Exercise(id=meta["id"], title=meta["title"], folder=folder, steps=steps)


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
