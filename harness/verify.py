"""`retrylab verify`: is lab step N done in a live lab environment? As a lab platform's check button.

Unlike `check` (hermetic: it copies the submission, runs the learner's scripts against a private
broker and watches them), `verify` looks at the environment as it stands: the learner's files and
the learner's own broker. It never runs the learner's code and never writes to that broker. What it
can decide that way it states as facts; what only running the code can show it names, and points to
`retrylab check`.

This module is the driver, knowing no exercise: the exercise's verifiers module (exercise.toml
`verifiers`) gives `step_verifiers()`, a `StepVerifier` per step, and `live_broker(url)`, its
broker's read-only view (used, shown: the URL without credentials, close()). A step whose file facts
already fail is "not yet" without asking the broker (the broker being down then changes nothing); a
step that needs the broker and cannot read it is "cannot check" (exit status 2).

Everything is said in the language asked for (`lang`, as `retrylab check --lang`): the report's frame
from the engine's catalog (harness/locales [verify]), the facts about the lab from the exercise's.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from retrylab import exercise as exercises
from retrylab import bidi, brokers, i18n

OK, FAIL, NOTE = "ok", "fail", "note"


class CannotCheck(Exception):
    """The step cannot be decided here (e.g. the learner's broker does not answer): exit status 2."""


@dataclass(frozen=True)
class Fact:
    status: str          # OK, FAIL, or NOTE (seen, and neither makes the step done nor not done)
    text: str


@dataclass(frozen=True)
class Verification:
    exercise_id: str
    step: exercises.Step
    directory: Path
    broker_url: str | None       # shown without credentials; None when the step read no broker
    facts: tuple[Fact, ...]
    unchecked: tuple[str, ...]   # what this step asks that only running the learner's code can show
    lang: str = i18n.DEFAULT     # the language of the facts, and of the report render() makes

    @property
    def done(self) -> bool:
        return not any(f.status == FAIL for f in self.facts)


class FactRecorder:
    """Where a step verifier writes the facts it establishes, in order."""

    def __init__(self):
        self.items: list[Fact] = []

    def add(self, fact: Fact) -> None:
        self.items.append(fact)

    def ok(self, text: str) -> None:
        self.add(Fact(OK, text))

    def fail(self, text: str) -> None:
        self.add(Fact(FAIL, text))

    def note(self, text: str) -> None:
        self.add(Fact(NOTE, text))

    @property
    def failed(self) -> bool:
        return any(f.status == FAIL for f in self.items)


@dataclass
class Live:
    """What a step verifier looks at: the learner's directory and own broker (read-only)."""
    directory: Path
    broker: Any                  # the exercise's live_broker(url): its broker's read-only view
    facts: FactRecorder


@dataclass(frozen=True)
class StepVerifier:
    run: Callable[[Live], None]
    unchecked: tuple[str, ...]


def _verifiers(exercise: exercises.Exercise):
    if not exercise.verifiers:
        raise CannotCheck(i18n.label("verify.unknown_exercise", exercise=repr(exercise.id)))
    return importlib.import_module(exercise.verifiers)


def verify(directory: Path, step_number: int, *, broker_url: str,
           exercise_id: str | None = None, lang: str = i18n.DEFAULT) -> Verification:
    """Decide whether step `step_number` is done, read-only, saying so in `lang`. Raises CannotCheck
    (exit status 2)."""
    with i18n.use(lang):
        exercise = exercises.get(exercise_id)
        step = exercise.step(step_number)
        module = _verifiers(exercise)
        verifier = module.step_verifiers()[step_number]
        live = Live(Path(directory), module.live_broker(broker_url), FactRecorder())
        try:
            verifier.run(live)
        finally:
            live.broker.close()
    return Verification(exercise_id=exercise.id, step=step, directory=Path(directory),
                        broker_url=live.broker.shown if live.broker.used else None,
                        facts=tuple(live.facts.items), unchecked=verifier.unchecked, lang=lang)


def render(result: Verification) -> str:
    """The report of a verification, in its language; lines kept free of unbalanced bidi controls."""
    step, lang = result.step, result.lang
    exercise = exercises.get(result.exercise_id)
    broker = brokers.get(exercise.broker)
    marks = {status: i18n.label(f"verify.{status}", lang) for status in (OK, FAIL, NOTE)}
    column = max(map(bidi.width, marks.values()))
    lines = [i18n.label("verify.heading", lang, number=step.number, title=i18n.step_text(exercise, step, "title", lang),
                        exercise=result.exercise_id),
             i18n.label("verify.directory", lang, path=str(result.directory)),
             i18n.label("verify.broker", lang, broker=broker.kind, url=result.broker_url) if result.broker_url
             else i18n.label("verify.no_broker", lang, broker=broker.kind),
             "", i18n.label("verify.checked", lang)]
    lines += [f"  {bidi.pad(marks[f.status], column)}  {f.text}" for f in result.facts]
    if result.unchecked:
        lines += [i18n.label("verify.unchecked", lang)]
        lines += [f"  {bidi.pad('-', column)}  {text}" for text in result.unchecked]
    lines.append("")
    if result.done:
        lines.append(i18n.label("verify.done", lang, number=step.number))
    else:
        lines += [i18n.label("verify.not_yet", lang, number=step.number),
                  i18n.label("report.hint", lang, hint=i18n.step_text(exercise, step, "hint", lang))]
    lines.append(i18n.label("verify.pointer", lang, directory=str(result.directory), number=step.number,
                            broker=broker.shown_name))
    return "\n".join(bidi.balance(line) for line in lines) + "\n"
