"""Grade a submission: run an exercise's checks under pytest, in-process, and build a Report."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import time
from pathlib import Path

import pytest

from retrylab import __version__, i18n
from retrylab import exercise as exercises
from retrylab import options, plugin
from retrylab.results import Report, StepResult

HARNESS_ERROR_LIMIT = 300


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase (setup, call, teardown) of a check item: pytest's report and the item's record."""
    report: pytest.TestReport
    record: plugin.CheckRecord

    @property
    def verdict(self) -> bool:
        """A failure that is a verdict on the learner (CheckFailed, a time limit), not a harness crash."""
        return self.report.failed and self.report.when in self.record.verdicts


class GradingPlugin:
    """A pytest plugin object that grades: registered for one session, it gathers each check's phases,
    the modules that could not be loaded and why the session stopped, and hands back the Report."""

    def __init__(self, exercise: exercises.Exercise):
        self.exercise = exercise
        self.config = None
        self.by_check: dict[int | str, list[Phase]] = {}
        self.harness_errors: list[str] = []
        self.interrupted = False      # Ctrl-C or SIGTERM: the steps not reached are not graded

    def pytest_configure(self, config):
        self.config = config

    @pytest.hookimpl(tryfirst=True)   # before the terminal reporter's, which can fail (_grade says how)
    def pytest_keyboard_interrupt(self, excinfo):
        # pytest calls this for Ctrl-C and for pytest.exit(); the harness's own exits are recorded (STOPPED)
        if not isinstance(excinfo.value, pytest.exit.Exception):
            self.interrupted = True

    def pytest_collectreport(self, report):
        if report.failed:
            self.harness_errors.append(i18n.label("grading.module_not_loaded", error=_last_line(report.longreprtext)))

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)   # outermost: the report as the retrylab plugin left it
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        record = plugin.record_of(item)
        if record.key is not None:   # every phase: setup time is the step's too
            self.by_check.setdefault(record.key, []).append(Phase(outcome.get_result(), record))

    @property
    def stopped_by(self) -> str:
        """Why the harness stopped the session (a backend that could not start, say), the whole reason."""
        return self.config.stash.get(plugin.STOPPED, "") if self.config is not None else ""

    def harness_error(self, exit_code: int) -> str:
        if self.interrupted:
            return i18n.label("grading.interrupted")   # not pytest's summary ("1 warning in 0.9s")
        if self.stopped_by:
            return self.stopped_by
        if self.harness_errors:
            return "; ".join(self.harness_errors)
        if exit_code in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
            return f"pytest ended the grading with exit status {int(exit_code)} (a harness defect)"
        return ""

    def report(self, exit_code: int, *, submission: Path, backend: str, steps: tuple[int, ...], lang: str,
               started: float) -> Report:
        exercise = self.exercise
        stopped = self.interrupted or bool(self.stopped_by)
        wanted = [s for s in exercise.steps if not steps or s.number in steps]
        advanced = () if steps else exercise.advanced
        results = tuple(_step_result(s, self.by_check.get(s.number, []), exercise, stopped) for s in wanted) + tuple(
            _step_result(a, self.by_check.get(a.slug, []), exercise, stopped) for a in advanced)
        return Report(exercise_id=exercise.id, exercise_title=i18n.exercise_catalog(exercise).text("title"),
                      submission=str(submission), backend=backend, harness_version=__version__,
                      results=quote_once(results), seconds=time.monotonic() - started,
                      harness_error=self.harness_error(exit_code), lang=lang, notes=_isolation_notes(exercise),
                      interrupted=self.interrupted)


def _last_line(text: str) -> str:
    """The last line of an error's text (the exception itself, after the traceback), cut."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "unknown error")[:HARNESS_ERROR_LIMIT]


def _records(phases: list[Phase]) -> list[plugin.CheckRecord]:
    """The records of a step's check items, once each, in order."""
    return list({id(p.record): p.record for p in phases}.values())


def _step_result(step: exercises.Step, phases: list[Phase], exercise: exercises.Exercise,
                 stopped: bool = False) -> StepResult:
    """The step's result, its title and labels in the current language (i18n.use). `stopped`: the
    grading ended early (interrupted, or the harness could not go on), so a step without a check run
    was not reached, which is no harness defect."""
    name = step.slug if step.kind == exercises.LAB else f"advanced:{step.slug}"
    records = _records(phases)
    located = [r.location for r in records if r.location is not None]
    location = located[-1] if located else ((step.file, None) if step.file else None)
    title = i18n.step_text(exercise, step, "title")
    hint = i18n.step_text(exercise, step, "hint")
    base = dict(name=name, title=title, number=step.number, weight=step.weight, location=location, kind=step.kind)
    if not phases:
        return StepResult(status="error", message=i18n.label("grading.not_reached" if stopped else "grading.no_check_ran"),
                          **base)
    reports = [p.report for p in phases]
    seconds = sum(r.duration for r in reports)
    output = "\n".join(text for r in records for text in r.output)
    failed = [p for p in phases if p.report.failed]
    if not any(r.when == "call" for r in reports) and not failed:
        return StepResult(status="error", message=i18n.label("grading.not_reached" if stopped else "grading.did_not_run"),
                          **base)
    if not failed:
        return StepResult(status="pass", output=output, seconds=seconds, **base)
    unjudged = next((p.record.unjudged for p in failed if p.record.unjudged is not None), None)
    if unjudged is not None:
        return StepResult(status="error", output=output, seconds=seconds,
                          message=i18n.label("grading.not_judged", reason=unjudged), **base)
    crash = next((p.report for p in failed if not p.verdict), None)
    if crash is not None:
        return StepResult(status="error", output=output, seconds=seconds,
                          message=i18n.label("grading.harness_failed", error=_last_line(crash.longreprtext)),
                          **base)
    message = "\n".join(plugin.message_of(p.report) for p in failed)
    return StepResult(status="fail", output=output, seconds=seconds,
                      message=f"{message}\n{i18n.label('report.hint', hint=hint)}", **base)


def grade(submission: Path, *, backend: str | None = None, steps: tuple[int, ...] = (),
          exercise_id: str | None = None, step_timeout: float | None = None,
          lang: str = i18n.DEFAULT, **broker_options) -> Report:
    """Grade `submission`; `backend`: one the exercise's broker offers (None: its default);
    `step_timeout` replaces every step's own time limit (exercise.toml); `broker_options`: the
    broker's own options by dest (Broker.options). Messages, titles and hints are in `lang` (en, zh,
    ru, fa): the checks build them so."""
    started = time.monotonic()
    exercise = exercises.get(exercise_id)
    backend = options.chosen_backend(backend, exercise)
    with i18n.use(lang):
        return _grade(submission, exercise, backend, steps, step_timeout, lang, broker_options, started)


def _option_args(given: dict) -> list[str]:
    """The pytest arguments of the broker options given (by dest)."""
    known = {option.dest: option for option in options.broker_options()}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise TypeError(f"grade() got unknown broker options: {', '.join(unknown)}")
    return [f"{known[dest].flags[0]}={value}" for dest, value in given.items() if value is not None]


# pytest's own plugins that no check uses: each costs start-up time in every grading (about 0.05 CPU-s
# together), and unraisableexception collects garbage twice on the way out
UNUSED_PYTEST_PLUGINS = ("cacheprovider", "randomly", "doctest", "pastebin", "junitxml", "nose", "legacypath",
                         "unraisableexception", "threadexception", "faulthandler", "stepwise", "setuponly",
                         "setupplan", "debugging", "unittest", "recwarn", "tmpdir", "monkeypatch")


def pytest_args(exercise) -> list[str]:
    """What every run of an exercise's checks gives pytest: its folder, the checks' own configuration, the plugin.

    --assert=plain: a check fails by raising CheckFailed with the learner's message, never by a bare assert (every
    other exception is a harness defect; tests/test_exercise_modules.py keeps it so), so rewriting the checks' asserts
    gives nothing. It cost about 5% of a grading's CPU: pytest parsed, rewrote and compiled every check module
    (and, where bytecode may not be written, did it again in every grading).

    --disable-plugin-autoload: only retrylab's plugin; other installed plugins (randomly, xdist, ...) would slow the
    start and change the order."""
    return [str(exercise.folder), "-c", str(exercises.CHECKS_DIR / "pytest.ini"), "--rootdir", str(exercises.CHECKS_DIR),
            "-p", "retrylab.plugin", *(f"-pno:{name}" for name in UNUSED_PYTEST_PLUGINS), "--assert=plain",
            "--disable-plugin-autoload", "-q", "--exercise", exercise.id]


def collect(exercise) -> int:
    """Collect the exercise's checks without running them (pytest's exit status): a warm grading process
    (retrylab.gradeworker) does it once, so that the gradings it forks find the checks and what they import
    (the broker's client library among them) already imported."""
    with _pytest_environment(), contextlib.redirect_stdout(io.StringIO()):
        return pytest.main([*pytest_args(exercise), "--collect-only"])


def _grade(submission, exercise, backend, steps, step_timeout, lang, broker_options, started) -> Report:
    grading = GradingPlugin(exercise)
    args = [*pytest_args(exercise), "--solution", str(submission), "--backend", backend,
            *(f"--step={s.number}" for s in exercise.steps if s.number in steps), *_option_args(broker_options),
            *((f"--step-timeout={step_timeout}",) if step_timeout is not None else ()), f"--lang={lang}"]
    with _pytest_environment(), contextlib.redirect_stdout(io.StringIO()):   # the Report says it all
        try:
            exit_code = pytest.main(args, plugins=[grading])
        except Exception as exc:
            # pytest's terminal reporter formats the interruption's traceback, and fails on a frame whose line is
            # unknown (Python 3.11 gives none for some instructions a signal can land in: a TypeError from
            # TracebackEntry.lineno). The session had ended and been cleaned up by then: it is the interruption.
            if not (grading.interrupted and _raised_in_pytest(exc)):
                raise
            exit_code = pytest.ExitCode.INTERRUPTED
    return grading.report(exit_code, submission=submission, backend=backend, steps=steps, lang=lang, started=started)


def _raised_in_pytest(exc: BaseException) -> bool:
    """Whether `exc` was raised in pytest's own code (its last frame), not in the harness's or a check's."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}_pytest{os.sep}" in tb.tb_frame.f_code.co_filename


def _isolation_notes(exercise) -> tuple[str, ...]:
    from retrylab import sandbox  # measured already: the checks ran learner code
    from retrylab.plugin import learner_imports
    isolated = sandbox.containment(learner_imports(exercise)).isolated
    return () if isolated else (i18n.label("report.isolation_partial"),)


# A quoted block in a message: consecutive lines indented by four spaces (verdict.indent), e.g. the
# end of a crashed script's stderr.
_QUOTED_BLOCK = re.compile(r"(?:^    .*(?:\n|$))+", re.MULTILINE)
QUOTE_ONCE_MIN = 120   # characters: a shorter quote costs less to repeat than to refer to
# Where a learner run's copy of the submission was (sandbox.Sandbox): a traceback names its files
# there. Each run has its own copy, so the path says nothing to the learner and differs between runs.
_RUN_COPY = re.compile(r"/[^\s\"']*?/retrylab-run-[^/\s\"']+/submission/")


def quote_once(results: tuple[StepResult, ...]) -> tuple[StepResult, ...]:
    """The results with each long quoted block shown once: a later step that quotes the same text
    (several steps read one run of the worker, and each says how it ended) refers to the first. A
    crashing worker's traceback would otherwise fill the report six times. Paths into a run's temporary
    copy of the submission are written relative to the submission (`File "main.py", line 21`)."""
    first_seen: dict[str, str] = {}
    out = []
    for result in results:
        where = i18n.label("report.step", number=result.number) if not result.advanced else result.name

        def refer(match: re.Match) -> str:
            block = match.group().rstrip("\n")
            if len(block) < QUOTE_ONCE_MIN:
                return match.group()
            if block not in first_seen:
                first_seen[block] = where
                return match.group()
            ending = "\n" if match.group().endswith("\n") else ""
            return "    " + i18n.label("grading.quoted_above", where=first_seen[block]) + ending

        message = _QUOTED_BLOCK.sub(refer, _RUN_COPY.sub("", result.message)) if result.message else result.message
        out.append(result if message == result.message else dataclasses.replace(result, message=message))
    return tuple(out)


# What the grading's own pytest would take from the environment, that a grading system or a CI job may have set for
# its own tests: PYTEST_ADDOPTS="-n 2" (xdist, for the pipeline's tests) made every grading a usage error, "-W error"
# a traceback, "-k ..." steps that never ran; PYTEST_PLUGINS loads modules into the grading, PYTEST_DEBUG writes
# pytest's trace on stderr. The report must be the same on every machine. (Autoloaded plugins: pytest_args.)
_FOREIGN_PYTEST_SETTINGS = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DEBUG")


@contextlib.contextmanager
def _pytest_environment():
    # only what is there is removed, and put back after: where none of these is set, os.environ is left alone while
    # the grading's early runs copy it in threads beside this one (sandbox._inherited_environment)
    removed = {name: os.environ.pop(name) for name in _FOREIGN_PYTEST_SETTINGS if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(removed)
