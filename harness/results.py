"""The one result model. Every reporter is a pure function of a `Report`."""
from __future__ import annotations

from dataclasses import dataclass, field

from retrylab.exercise import ADVANCED, LAB


@dataclass(frozen=True)
class StepResult:
    name: str                 # "worker" for lab steps, "advanced:<id>" for advanced checks
    title: str
    status: str               # "pass" | "fail" | "error" (the harness could not judge it)
    message: str = ""         # what was expected, what was observed, and the hint
    output: str = ""          # what the learner's scripts printed (bounded)
    seconds: float = 0.0
    number: int | None = None  # the lab step number; None for advanced checks
    weight: float = 1.0
    # The learner's file this result is about (relative to the submission) and its 1-based line
    # when the check knows it, e.g. ("schedule.txt", 3); None when no file applies.
    location: tuple[str, int | None] | None = None
    kind: str = LAB           # the step's kind (exercise.LAB or exercise.ADVANCED)

    @property
    def advanced(self) -> bool:
        return self.kind == ADVANCED

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass(frozen=True)
class Report:
    exercise_id: str
    exercise_title: str
    submission: str
    backend: str
    harness_version: str
    results: tuple[StepResult, ...]
    seconds: float = 0.0
    harness_error: str = ""   # one line: why the harness could not grade (exit status 2)
    notes: tuple[str, ...] = field(default_factory=tuple)
    lang: str = "en"          # the language of titles and messages (and of the text report's labels)
    # Ctrl-C or SIGTERM stopped the grading: the steps it reached keep their result, the others are
    # "error" (not graded), harness_error says "interrupted", and the exit status is 130
    interrupted: bool = False

    @property
    def lab_results(self) -> tuple[StepResult, ...]:
        return tuple(r for r in self.results if not r.advanced)

    @property
    def advanced_results(self) -> tuple[StepResult, ...]:
        return tuple(r for r in self.results if r.advanced)

    @property
    def lab_passed(self) -> bool:
        return all(r.passed for r in self.lab_results)

    def exit_status(self, strict: bool = False) -> int:
        if self.interrupted:
            return 130   # as a shell reports a command ended by SIGINT
        if self.harness_error or any(r.status == "error" for r in self.results):
            return 2
        checked = self.results if strict else self.lab_results
        return 0 if all(r.passed for r in checked) else 1
