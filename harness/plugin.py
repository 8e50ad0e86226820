"""retrylab's pytest plugin: options, the fixtures checks use, and per-step results.

Registered through the `pytest11` entry point, so `pytest checks --solution DIR` works as well as
the `retrylab` command (which runs pytest in-process with this plugin). Inert unless a check is
collected: the options exist in every pytest run, the fixtures only do work when asked for.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from retrylab import exercise as exercises
from retrylab.backends import BackendUnavailable, make_backend, BACKENDS
from retrylab.runner import LearnerRunner
from retrylab.verdict import CheckFailed

OUTPUT_KEY = "retrylab_output"
STEP_KEY = "retrylab_step"
VERDICT = ("retrylab_verdict", "fail")  # marks a failure that is a verdict on the learner, not a crash


def pytest_addoption(parser):
    group = parser.getgroup("retrylab", "grading a learner's submission")
    group.addoption("--solution", metavar="DIR", help="the submission directory to grade")
    group.addoption("--backend", default="fake", choices=sorted(BACKENDS),
                    help="the kind of private Redis the checks use (default: fake)")
    group.addoption("--step", dest="retrylab_steps", action="append", type=int, default=[],
                    metavar="N", help="grade only lab step N (repeatable)")


def pytest_configure(config):
    config.addinivalue_line("markers", "step(number): the lab step a check module grades")
    config.addinivalue_line("markers", "advanced(id): an advanced check, reported apart from the lab")


def check_key(item) -> int | str | None:
    """The lab step number a check grades, or its advanced check's id."""
    marker = item.get_closest_marker("step")
    if marker:
        return int(marker.args[0])
    marker = item.get_closest_marker("advanced")
    return str(marker.args[0]) if marker else None


def pytest_collection_modifyitems(config, items):
    wanted = set(config.getoption("retrylab_steps") or ())
    if not wanted:
        return
    keep = [item for item in items if check_key(item) in wanted]  # advanced checks run only in full grading
    deselected = [item for item in items if item not in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = keep


@pytest.fixture(scope="session")
def submission(pytestconfig) -> Path:
    value = pytestconfig.getoption("--solution")
    if not value:
        raise pytest.UsageError("the checks grade a submission: pass --solution DIR")
    path = Path(value).resolve()
    if not path.is_dir():
        raise pytest.UsageError(f"--solution {value}: not a directory")
    return path


@pytest.fixture(scope="session")
def redis_backend(pytestconfig):
    backend = make_backend(pytestconfig.getoption("--backend"))
    try:
        backend.start()
    except BackendUnavailable as exc:
        pytest.exit(f"retrylab: {exc}", returncode=2)
    yield backend
    backend.stop()


@pytest.fixture(scope="session")
def learner(submission) -> LearnerRunner:
    """Runs the learner's scripts; see LearnerRunner.run."""
    return LearnerRunner(submission)


@pytest.fixture
def step(request) -> exercises.Step:
    """The metadata (title, hint, time limit) of the step or advanced check being run."""
    key = check_key(request.node)
    exercise = exercises.for_path(Path(request.node.fspath))
    if key is None or exercise is None:
        raise pytest.UsageError(f"{request.node.nodeid}: a check needs pytest.mark.step(N) or pytest.mark.advanced(ID)")
    return exercise.check(key)


def attach_output(node, text: str) -> None:
    """Record what the learner's script printed, for reporters that show it."""
    if text:
        node.user_properties.append((OUTPUT_KEY, text))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.user_properties.append((STEP_KEY, check_key(item)))
    if call.excinfo is not None and call.excinfo.errisinstance(CheckFailed):
        # A learner-facing verdict, not a harness bug: show the message without a traceback.
        report.outcome = "failed"
        report.longrepr = call.excinfo.value.message
        report.user_properties.append(VERDICT)
