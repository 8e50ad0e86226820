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
from retrylab.plugin import LOCATION_KEY, OUTPUT_KEY, STEP_KEY, VERDICT
from retrylab.results import Report, StepResult

HARNESS_ERROR_LIMIT = 300


class _Collector:
    """Gathers each check's outcome, message and output as pytest reports them."""

    def __init__(self):
        self.by_check: dict[int | str, list] = {}
        self.harness_errors: list[str] = []
        self.interrupted = False      # Ctrl-C or SIGTERM: the steps not reached are not graded
        self.stopped_by = ""          # why the harness stopped the session (pytest.exit), the whole reason

    def pytest_keyboard_interrupt(self, excinfo):
        # pytest calls this for Ctrl-C and for pytest.exit() (a backend that could not start, say)
        if isinstance(excinfo.value, pytest.exit.Exception):
            self.stopped_by = str(excinfo.value.msg).removeprefix("retrylab:").strip()
        else:
            self.interrupted = True

    def pytest_collectreport(self, report):
        if report.failed:
            self.harness_errors.append(i18n.label("grading.module_not_loaded", error=_first_line(report.longreprtext)))

    def pytest_runtest_logreport(self, report):
        key = _check_of(report)
        if key is None:
            return
        self.by_check.setdefault(key, []).append(report)  # every phase: setup time is the step's too


def _check_of(report) -> int | str | None:
    return next((value for key, value in report.user_properties if key == STEP_KEY), None)


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "unknown error")[:HARNESS_ERROR_LIMIT]


def _properties(reports: list, key: str) -> list:
    """The values a check attached under `key`. Each phase's report (setup, call, teardown) copies
    the item's properties so far: only the last report of each check item is read."""
    last = {}
    for report in reports:
        last[report.nodeid] = report.user_properties
    return [value for properties in last.values() for k, value in properties if k == key]


def _step_result(step: exercises.Step, reports: list, exercise: exercises.Exercise | None = None,
                 stopped: bool = False) -> StepResult:
    """The step's result, its title and labels in the current language (i18n.use). `stopped`: the
    grading ended early (interrupted, or the harness could not go on), so a step without a check run
    was not reached, which is no harness defect."""
    name = step.slug if step.number is not None else f"advanced:{step.slug}"
    located = _properties(reports, LOCATION_KEY)
    location = located[-1] if located else ((step.file, None) if step.file else None)
    title = i18n.step_text(exercise, step, "title") if exercise else step.title
    hint = i18n.step_text(exercise, step, "hint") if exercise else step.hint
    base = dict(name=name, title=title, number=step.number, weight=step.weight, location=location)
    if not reports:
        return StepResult(status="error", message=i18n.label("grading.not_reached" if stopped else "grading.no_check_ran"),
                          **base)
    seconds = sum(r.duration for r in reports)
    output = "\n".join(_properties(reports, OUTPUT_KEY))
    failed = [r for r in reports if r.failed]
    if not any(r.when == "call" for r in reports) and not failed:
        return StepResult(status="error", message=i18n.label("grading.not_reached" if stopped else "grading.did_not_run"),
                          **base)
    if not failed:
        return StepResult(status="pass", output=output, seconds=seconds, **base)
    verdicts = [r for r in failed if VERDICT in r.user_properties]
    if len(verdicts) < len(failed):
        crash = next(r for r in failed if r not in verdicts)
        return StepResult(status="error", output=output, seconds=seconds,
                          message=i18n.label("grading.harness_failed", error=_first_line(crash.longreprtext)),
                          **base)
    message = "\n".join(str(r.longrepr) for r in verdicts)
    return StepResult(status="fail", output=output, seconds=seconds,
                      message=f"{message}\n{i18n.label('report.hint', hint=hint)}", **base)


def grade(submission: Path, *, backend: str = "fake", steps: tuple[int, ...] = (),
          exercise_id: str = exercises.DEFAULT_EXERCISE, redis_url: str | None = None,
          step_timeout: float | None = None, lang: str = i18n.DEFAULT) -> Report:
    """Grade `submission`; `step_timeout` replaces every step's own time limit (exercise.toml).
    Messages, titles and hints are in `lang` (en, zh, ru, fa): the checks build them so."""
    started = time.monotonic()
    with i18n.use(lang):
        return _grade(submission, backend, steps, exercise_id, redis_url, step_timeout, lang, started)


def _grade(submission, backend, steps, exercise_id, redis_url, step_timeout, lang, started) -> Report:
    exercise = exercises.get(exercise_id)
    wanted = [s for s in exercise.steps if not steps or s.number in steps]
    advanced = () if steps else exercise.advanced
    collector = _Collector()
    args = [str(exercise.folder), "-c", str(exercises.CHECKS_DIR / "pytest.ini"),
            "--rootdir", str(exercises.CHECKS_DIR), "-p", "retrylab.plugin", "-p", "no:cacheprovider",
            "-p", "no:randomly", "-q", "--solution", str(submission), "--backend", backend,
            *(f"--step={s.number}" for s in wanted if steps), *((f"--redis-url={redis_url}",) if redis_url else ()),
            *((f"--step-timeout={step_timeout}",) if step_timeout is not None else ()), f"--lang={lang}"]
    captured = io.StringIO()
    with _no_plugin_autoload(), contextlib.redirect_stdout(captured):
        exit_code = pytest.main(args, plugins=[collector])
    harness_error = "; ".join(collector.harness_errors)
    if collector.interrupted:
        harness_error = i18n.label("grading.interrupted")   # not pytest's summary ("1 warning in 0.9s")
    elif collector.stopped_by:
        harness_error = collector.stopped_by                 # the whole reason, not a terminal-wide cut
    elif exit_code in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR, 2) and not harness_error:
        harness_error = _first_line(captured.getvalue()) if exit_code != 2 else _exit_reason(captured.getvalue())
    stopped = collector.interrupted or bool(collector.stopped_by)
    results = tuple(_step_result(s, collector.by_check.get(s.number, []), exercise, stopped) for s in wanted) + tuple(
        _step_result(a, collector.by_check.get(a.slug, []), exercise, stopped) for a in advanced)
    results = quote_once(results)
    return Report(exercise_id=exercise.id, exercise_title=i18n.exercise_catalog(exercise).text("title"),
                  submission=str(submission),
                  backend=backend, harness_version=__version__, results=results,
                  seconds=time.monotonic() - started, harness_error=harness_error, lang=lang,
                  notes=_isolation_notes(), interrupted=collector.interrupted)


def _isolation_notes() -> tuple[str, ...]:
    from retrylab import sandbox  # measured already: the checks ran learner code
    return () if sandbox.containment().isolated else (i18n.label("report.isolation_partial"),)


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
    copy of the submission are written relative to the submission (`File "worker.py", line 21`)."""
    first_seen: dict[str, str] = {}
    out = []
    for result in results:
        where = (i18n.label("report.step", number=result.number) if result.number is not None else result.name)

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


def _exit_reason(output: str) -> str:
    for line in output.splitlines():
        if "retrylab:" in line:
            return line[line.index("retrylab:") + len("retrylab:"):].strip()[:HARNESS_ERROR_LIMIT]
    return _first_line(output)


@contextlib.contextmanager
def _no_plugin_autoload():
    # Only retrylab's plugin: other installed plugins (randomly, xdist, ...) would slow the start
    # and change the order; the CLI's report must be the same on every machine.
    previous = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        else:
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = previous
