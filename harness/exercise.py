"""An exercise is data (exercise.toml: steps, titles, hints, weights, limits) plus check modules.

The engine reads exercises from the `checks` package; adding a lab means adding a folder there.
"""
from __future__ import annotations

import importlib.util
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

# Where the exercises' folders are: the package the checks install as (checks/ in a checkout),
# found without importing it
CHECKS_DIR = Path(importlib.util.find_spec("retrylab.checks").origin).resolve().parent


LAB, ADVANCED = "lab", "advanced"


@dataclass(frozen=True)
class Step:
    """A lab step (kind LAB, numbered) or an advanced check (kind ADVANCED: no number, reported apart,
    worth 0 points)."""
    number: int | None
    slug: str
    title: str
    hint: str
    weight: float
    timeout: float
    file: str = ""   # the learner's file a failure points at (annotations), relative to the submission
    kind: str = LAB
    files: tuple[str, ...] = ()      # every learner file the step reads (`file` when not given)
    formulas: tuple[str, ...] = ()   # names in the exercise's [formulas] that `explain` shows


@dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    folder: Path
    steps: tuple[Step, ...]
    advanced: tuple[Step, ...] = ()
    broker: str = ""                 # the kind of broker its checks need (retrylab.brokers.<kind>)
    # "module:factory" of the harness side of the exercise's application module (the one learner code
    # calls): it decides each call's outcome; None when learner code calls none
    application: str | None = None
    verifiers: str | None = None     # module with the exercise's `retrylab verify` step verifiers
    formulas: dict = field(default_factory=dict)   # [formulas]: name -> code
    seed: str = ""
    default: bool = False            # graded when no exercise is named (exercise.toml `default = true`)

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
    def make(entry: dict, number: int | None, slug: str, weight: float, kind: str) -> Step:
        file = str(entry.get("file", ""))
        files = tuple(str(f) for f in entry.get("files", ())) or ((file,) if file else ())
        return Step(number=number, slug=slug, title=entry["title"], hint=entry["hint"], weight=weight,
                    timeout=float(entry.get("timeout", defaults.get("timeout", 20))), file=file, kind=kind,
                    files=files, formulas=tuple(str(f) for f in entry.get("formulas", ())))

    steps = tuple(make(s, int(s["number"]), s["slug"], float(s.get("weight", defaults.get("weight", 1))), LAB)
                  for s in meta["steps"])
    advanced = tuple(make(a, None, a["id"], 0.0, ADVANCED) for a in meta.get("advanced", ()))
    return Exercise(id=meta["id"], title=meta["title"], folder=folder, steps=steps, advanced=advanced,
                    broker=str(meta["broker"]), application=meta.get("application"),
                    verifiers=meta.get("verifiers"), formulas=dict(meta.get("formulas", {})),
                    seed=str(meta.get("seed", "")), default=meta.get("default") is True)


@cache
def exercises() -> dict[str, Exercise]:
    found = {}
    for toml in sorted(CHECKS_DIR.glob("*/exercise.toml")):
        exercise = _load(toml.parent)
        found[exercise.id] = exercise
    return found


@cache
def default_id() -> str:
    """The exercise graded when none is named: the one whose exercise.toml says `default = true` (the
    only one, when there is one)."""
    found = exercises()
    chosen = [e.id for e in found.values() if e.default] or (list(found) if len(found) == 1 else [])
    if len(chosen) != 1:
        raise UnknownExercise("no default exercise: exactly one exercise.toml must say `default = true`")
    return chosen[0]


def get(exercise_id: str | None = None) -> Exercise:
    """The exercise `exercise_id`; None: the default one (`default_id`)."""
    exercise_id = exercise_id or default_id()
    try:
        return exercises()[exercise_id]
    except KeyError:
        known = ", ".join(sorted(exercises())) or "none"
        raise UnknownExercise(f"unknown exercise {exercise_id!r} (known: {known})") from None


@cache
def for_path(path: Path) -> Exercise | None:
    """The exercise whose folder holds `path` (a check module), if any. Kept: the plugin asks for each phase of
    each check, and every answer resolves the folders' real paths, as many file-system lookups as there are
    folders in them (exercises() is kept too, so the answer cannot change)."""
    path = Path(path).resolve()
    for exercise in exercises().values():
        if exercise.folder.resolve() in path.parents:
            return exercise
    return None
