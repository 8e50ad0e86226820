"""retrylab's pytest plugin: options, the fixtures checks use, and per-step results.

Registered through the `pytest11` entry point, so `pytest checks --solution DIR` works as well as
the `retrylab` command (which runs pytest in-process with this plugin). Inert unless a check is
collected: the options exist in every pytest run, the fixtures only do work when asked for.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from pathlib import Path
from typing import NoReturn

import pytest

from retrylab import exercise as exercises
from retrylab import i18n, options, tempdirs
from retrylab.limits import StepClock, StepTimeLimit, step_label
from retrylab.reporters.bounds import neutral
from retrylab.reporters.github import inert_text
from retrylab.runner import LearnerRunner
from retrylab.verdict import CannotJudge, CheckFailed

CLOCK = pytest.StashKey[StepClock]()
LANGUAGE = pytest.StashKey[object]()   # the token of the language made current for the session
EXERCISE = pytest.StashKey[exercises.Exercise]()   # the exercise whose checks the session runs
STOPPED = pytest.StashKey[str]()       # why the harness stopped the session (cannot_grade), in one line
# In setup the runner holds learner runs to the step's deadline; the alarm there is only a backstop
# against a harness hang, later, so that it does not interrupt a session fixture other steps share.
SETUP_ALARM_GRACE = 2.0


@dataclasses.dataclass
class CheckRecord:
    """What a check item said about itself as it ran, beside pytest's reports of its phases; the
    grading (retrylab.grading) reads it. One per check item, kept in the item's stash."""
    key: int | str | None                   # check_key: the lab step number or advanced check id
    output: list[str] = dataclasses.field(default_factory=list)   # what the learner's scripts printed
    location: tuple[str, int | None] | None = None   # where in the learner's files a failure points
    verdicts: set[str] = dataclasses.field(default_factory=set)   # phases whose failure is a verdict, no crash
    unjudged: str | None = None             # why the check could not judge the step (CannotJudge), no crash


RECORD = pytest.StashKey[CheckRecord]()


def record_of(item) -> CheckRecord:
    if RECORD not in item.stash:
        item.stash[RECORD] = CheckRecord(check_key(item))
    return item.stash[RECORD]


def cannot_grade(config, reason: str) -> NoReturn:
    """Stop the session because the harness cannot grade here (a backend that cannot start, isolation
    required but missing): exit status 2. The reason is kept for the grading (STOPPED) and said."""
    config.stash[STOPPED] = reason
    pytest.exit(f"retrylab: {reason}", returncode=2)


def grading_backend(config, kind: str, name: str, **options):
    """What a broker's session fixture yields (`yield from`): the grading's backend, started (ahead, if
    `retrylab check` began it: brokers.start_early), stopped after the last check. One that cannot work here
    ends the grading with exit status 2 and one line."""
    from retrylab import brokers
    try:
        backend = brokers.started_backend(kind, name, **options)
    except brokers.BackendUnavailable as exc:
        cannot_grade(config, str(exc))
    yield backend
    backend.stop()


def pytest_addoption(parser):
    group = parser.getgroup("retrylab", "grading a learner's submission")
    group.addoption("--solution", metavar="DIR", help="the submission directory to grade")
    for option in (options.EXERCISE, options.backend_option(), *options.broker_options(), options.STEP,
                   options.STEP_TIMEOUT, options.ISOLATION, options.LANG):
        option.add_to_pytest(group)


def pytest_sessionstart(session):
    if session.config.getoption("--solution"):  # the first learner run need not wait for the template
        from retrylab.sandbox import prepare
        exercise = session.config.stash.get(EXERCISE, None)
        prepare(learner_imports(exercise), warm_imports(exercise))
    # before any check: a grader who requires isolation gets one line and status 2, nothing graded
    if session.config.getoption("--solution") and session.config.getoption("retrylab_isolation") == "required":
        from retrylab.sandbox import isolation_problem
        problem = isolation_problem("required", learner_imports(session.config.stash.get(EXERCISE, None)))
        if problem:
            cannot_grade(session.config, problem)


def pytest_configure(config):
    config.addinivalue_line("markers", "step(number): the lab step a check module grades")
    config.addinivalue_line("markers", "advanced(id): an advanced check, reported apart from the lab")
    override = config.getoption("retrylab_step_timeout")
    problem = options.seconds_problem("--step-timeout", override)
    if problem:
        raise pytest.UsageError(problem)
    config.stash[CLOCK] = StepClock(override)
    chosen = config.getoption("retrylab_exercise")
    if chosen:
        try:
            config.stash[EXERCISE] = exercises.get(chosen)
        except exercises.UnknownExercise as exc:
            raise pytest.UsageError(str(exc)) from None
    if config.getoption("--solution") and config.option.tbstyle == "auto":
        # pytest's default ("long") traceback of a failed check shows each frame's arguments through
        # repr(): a session fixture holding what a learner stored (a 20 MB value, say) would be turned
        # into a string of several times that size, for every failed check. "short" shows no arguments.
        config.option.tbstyle = "short"
    lang = config.getoption("retrylab_lang")
    if lang or config.getoption("--solution"):  # grading: messages in the chosen language
        config.stash[LANGUAGE] = i18n.activate(i18n.resolve(lang))
    if config.getoption("--solution"):  # what gradings killed outright left behind goes now
        tempdirs.sweep_stale()


def pytest_unconfigure(config):
    token = config.stash.get(LANGUAGE, None)
    if token is not None:
        i18n.deactivate(token)


def check_key(item) -> int | str | None:
    """The lab step number a check grades, or its advanced check's id."""
    marker = item.get_closest_marker("step")
    if marker:
        return int(marker.args[0])
    marker = item.get_closest_marker("advanced")
    return str(marker.args[0]) if marker else None


def _check_order(item) -> tuple[int, int]:
    key = check_key(item)
    return (0, key) if isinstance(key, int) else (1 if key is not None else 2, 0)


@pytest.hookimpl(trylast=True)  # after any shuffling plugin: the order below is part of grading
def pytest_collection_modifyitems(config, items):
    # Lab steps first, by number, then advanced checks: the first check to use a shared session
    # fixture (the worker run) pays for it within its own time limit, so that is step 1's.
    items.sort(key=_check_order)
    _choose_exercise(config, items)
    wanted = set(config.getoption("retrylab_steps") or ())
    keep = [item for item in items if _exercise_of(item) in (None, config.stash.get(EXERCISE, None))
            and (not wanted or check_key(item) in wanted)]   # advanced checks run only in full grading
    deselected = [item for item in items if item not in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = keep


def _exercise_of(item) -> exercises.Exercise | None:
    return exercises.for_path(item.path)


def _choose_exercise(config, items) -> None:
    """The session grades one exercise: --exercise, else the one whose checks were collected; the
    backend is then known to be one its broker offers (--backend, else the broker's default)."""
    if EXERCISE not in config.stash:
        found = list(dict.fromkeys(e.id for e in map(_exercise_of, items) if e is not None))
        if not found:
            return   # no check collected (another project's tests): the plugin stays inert
        if len(found) > 1:
            raise pytest.UsageError(f"checks of {', '.join(found)} collected: grade one exercise at a time"
                                    " (--exercise ID)")
        config.stash[EXERCISE] = exercises.get(found[0])
    try:
        config.option.backend = options.chosen_backend(config.option.backend, config.stash[EXERCISE])
    except options.OptionError as exc:
        cannot_grade(config, str(exc))


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
def learner(submission, pytestconfig) -> LearnerRunner:
    """Runs the learner's scripts (see LearnerRunner.run), within the current step's time limit, with
    the session's exercise's application module."""
    exercise = pytestconfig.stash.get(EXERCISE, None)
    return LearnerRunner(submission, clock=pytestconfig.stash[CLOCK],
                         application=exercise.application if exercise else None,
                         learner_imports=learner_imports(exercise), warm_imports=warm_imports(exercise))


def learner_imports(exercise) -> tuple[str, ...]:
    """The client libraries learner code on the exercise's broker imports (what the sandbox must offer)."""
    from retrylab import brokers
    return brokers.get(exercise.broker).learner_imports if exercise else ()


def warm_imports(exercise) -> tuple[str, ...]:
    """Those of them the warm learner template imports ahead (Broker.warm_imports)."""
    from retrylab import brokers
    return brokers.get(exercise.broker).warm_imports if exercise else ()


@pytest.fixture
def step(request) -> exercises.Step:
    """The metadata (title, hint, time limit) of the step or advanced check being run."""
    key = check_key(request.node)
    exercise = exercises.for_path(request.node.path)
    if key is None or exercise is None:
        raise pytest.UsageError(f"{request.node.nodeid}: a check needs pytest.mark.step(N) or pytest.mark.advanced(ID)")
    meta = exercise.check(key)
    return dataclasses.replace(meta, timeout=request.config.stash[CLOCK].limit_of(meta))


def attach_output(node, text: str) -> None:
    """Record what the learner's script printed, for reporters that show it."""
    if text:
        record_of(node).output.append(text)


def attach_location(node, file: str, line: int | None = None) -> None:
    """Point this check's failure at the learner's file (relative to the submission) and 1-based line,
    for reporters that can (GitHub annotations). Without it, the step's `file` in exercise.toml."""
    record_of(node).location = (file, line)


def _timed(item) -> tuple[int | str, str, float] | None:
    """(key, label, limit) of the step a check item belongs to; None for anything else."""
    key = check_key(item)
    exercise = exercises.for_path(item.path) if key is not None else None
    if exercise is None:
        return None
    try:
        meta = exercise.check(key)
    except KeyError:
        return None
    return key, step_label(meta), item.config.stash[CLOCK].limit_of(meta)


def _step_limit(item, alarm_grace: float = 0.0):
    timed = _timed(item)
    return item.config.stash[CLOCK].phase(*timed, alarm_grace=alarm_grace) if timed else contextlib.nullcontext()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    try:
        return (yield)
    except KeyboardInterrupt as exc:
        # pytest runs a fixture's finalizers only if its setup ended in a value or an Exception; one cut
        # by Ctrl-C (or SIGTERM, which the CLI turns into it) would leave what it started running: a
        # learner run beside it, a temporary copy. Recorded as failed, it is torn down with the session.
        if fixturedef.cached_result is None:
            fixturedef.cached_result = (None, fixturedef.cache_key(request), (exc, exc.__traceback__))
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _step_limit(item, alarm_grace=SETUP_ALARM_GRACE):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _step_limit(item):
        return (yield)


class LearnerMessage(str):
    """A verdict's message as a report's longrepr. What pytest shows of it (its terminal, the short summary's line,
    which takes only a str, its junitxml, xdist's copy) is the string itself: the learner's text made inert, no ESC
    sequence for the terminal and no line GitHub Actions would run as a workflow command (`::add-mask::`), as
    `retrylab check`'s own reports show it. A grading reads `message`, the text as the check wrote it: each of its
    reporters makes it safe for its own format."""

    message: str

    def __new__(cls, message: str):
        shown = super().__new__(cls, inert_text(neutral(message)))
        shown.message = message
        return shown

    def __reduce__(self):
        return LearnerMessage, (self.message,)

    def toterminal(self, out) -> None:
        out.line(str(self))


def message_of(report) -> str:
    """The failure text of a check's report: a verdict's message as written, anything else as pytest has it."""
    return getattr(report.longrepr, "message", None) or str(report.longrepr)


def _verdict(item, report, message: str) -> None:
    report.outcome = "failed"
    report.longrepr = LearnerMessage(message)
    record_of(item).verdicts.add(report.when)


@pytest.hookimpl(tryfirst=True, specname="pytest_runtest_makereport")
def pytest_runtest_makereport_without_traceback(item, call):
    """The report of a check that gave a verdict (or could not judge), made without pytest's traceback.

    pytest would format one first (each frame's source, found through inspect's walk of every module's real
    path), for a text the wrapper below replaces with the message: 4% of the CPU of a batch of the corpus.
    An empty message is left to pytest: as the text of a failure, pytest would take it for no failure at all."""
    if (call.excinfo is not None and call.excinfo.errisinstance((CheckFailed, CannotJudge))
            and call.excinfo.value.message):
        plain = copy.copy(call)
        plain.excinfo = LearnerMessage(call.excinfo.value.message)   # pytest takes a non-ExceptionInfo as the text
        return pytest.TestReport.from_item_and_call(item, plain)
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(CheckFailed):
        # A learner-facing verdict, not a harness bug: show the message without a traceback.
        _verdict(item, report, call.excinfo.value.message)
    elif call.excinfo is not None and call.excinfo.errisinstance(CannotJudge):
        report.longrepr = LearnerMessage(call.excinfo.value.message)    # not graded, and said why: no traceback
        record_of(item).unjudged = call.excinfo.value.message
    timed = _timed(item) if call.when in ("setup", "call") else None
    if timed is None:
        return
    key, label, limit = timed
    clock = item.config.stash[CLOCK]
    if call.excinfo is not None and call.excinfo.errisinstance(StepTimeLimit) and call.excinfo.value.key != key:
        # a session fixture (the shared worker run) was stopped by the step that started it
        _verdict(item, report, i18n.label("limits.shared", label=label, message=call.excinfo.value.message))
    elif clock.over(key, limit) and not report.skipped:
        _verdict(item, report, clock.message())
