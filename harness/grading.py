"""Grade a submission: run an exercise's checks under pytest, in-process, and build a Report."""
from __future__ import annotations

import contextlib
import io
import os
import time
from pathlib import Path

import pytest

from retrylab import __version__
from retrylab import exercise as exercises
from retrylab.plugin import OUTPUT_KEY, STEP_KEY, VERDICT
from retrylab.results import Report, StepResult

HARNESS_ERROR_LIMIT = 300


class _Collector:
    """Gathers each check's outcome, message and output as pytest reports them."""

    def __init__(self):
        self.by_check: dict[int | str, list] = {}
        self.harness_errors: list[str] = []

    def pytest_collectreport(self, report):
        if report.failed:
            self.harness_errors.append(f"a check module could not be loaded: {_first_line(report.longreprtext)}")

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


def _step_result(step: exercises.Step, reports: list) -> StepResult:
    name = step.slug if step.number is not None else f"advanced:{step.slug}"
    base = dict(name=name, title=step.title, number=step.number, weight=step.weight)
    if not reports:
        return StepResult(status="error", message="no check ran for this step (a harness defect)", **base)
    seconds = sum(r.duration for r in reports)
    output = "\n".join(v for r in reports for k, v in r.user_properties if k == OUTPUT_KEY)
    failed = [r for r in reports if r.failed]
    if not any(r.when == "call" for r in reports) and not failed:
        return StepResult(status="error", message="the check for this step did not run", **base)
    if not failed:
        return StepResult(status="pass", output=output, seconds=seconds, **base)
    verdicts = [r for r in failed if VERDICT in r.user_properties]
    if len(verdicts) < len(failed):
        crash = next(r for r in failed if r not in verdicts)
        return StepResult(status="error", output=output, seconds=seconds,
                          message=f"the harness failed while checking this step: {_first_line(crash.longreprtext)}",
                          **base)
    message = "\n".join(str(r.longrepr) for r in verdicts)
    return StepResult(status="fail", output=output, seconds=seconds,
                      message=f"{message}\nHint: {step.hint}", **base)


def grade(submission: Path, *, backend: str = "fake", steps: tuple[int, ...] = (),
          exercise_id: str = exercises.DEFAULT_EXERCISE) -> Report:
    started = time.monotonic()
    exercise = exercises.get(exercise_id)
    wanted = [s for s in exercise.steps if not steps or s.number in steps]
    advanced = () if steps else exercise.advanced
    collector = _Collector()
    args = [str(exercise.folder), "-c", str(exercises.CHECKS_DIR / "pytest.ini"),
            "--rootdir", str(exercises.CHECKS_DIR), "-p", "retrylab.plugin", "-p", "no:cacheprovider",
            "-p", "no:randomly", "-q", "--solution", str(submission), "--backend", backend,
            *(f"--step={s.number}" for s in wanted)]
    captured = io.StringIO()
    with _no_plugin_autoload(), contextlib.redirect_stdout(captured):
        exit_code = pytest.main(args, plugins=[collector])
    harness_error = "; ".join(collector.harness_errors)
    if exit_code in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR, 2) and not harness_error:
        harness_error = _first_line(captured.getvalue()) if exit_code != 2 else _exit_reason(captured.getvalue())
    results = tuple(_step_result(s, collector.by_check.get(s.number, [])) for s in wanted) + tuple(
        _step_result(a, collector.by_check.get(a.slug, [])) for a in advanced)
    return Report(exercise_id=exercise.id, exercise_title=exercise.title, submission=str(submission),
                  backend=backend, harness_version=__version__, results=results,
                  seconds=time.monotonic() - started, harness_error=harness_error)


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
