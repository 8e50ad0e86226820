"""Per-step time limits: each step has its own (exercise.toml `timeout`, or `--step-timeout`).

A step's limit covers its setup (e.g. the shared worker run, for the step that triggers it) and its
checks. Two mechanisms enforce it, so that an over-time step fails alone and nothing keeps running:

- learner runs are bounded by the time the step has left (`LearnerRunner` asks `remaining()`), so
  the sandbox kills the learner's process group itself and the run returns normally, cut short;
- a SIGALRM timer (main thread only) stops check code that overruns, by raising `StepTimeLimit`
  (a `CheckFailed`) inside it. While a learner run is in progress the alarm waits: the run is
  already bounded and cleans up after itself; interrupting it would only lose what it observed.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Sequence

from retrylab import i18n
from retrylab.verdict import CheckFailed

# A learner run ends this long before the step's deadline: time to stop its process group
# (SIGTERM, then SIGKILL after half a second) and collect what it did.
RUN_MARGIN = 0.75
# How soon a deferred alarm fires once the shield that held it is left.
_SOON = 0.001


class StepTimeLimit(CheckFailed):
    """The step did not finish within its time limit."""

    def __init__(self, message: str, key):
        super().__init__(message)
        self.key = key


def describe_limit(label: str, limit: float, cut: Sequence[str] = ()) -> str:
    """The verdict on a step that overran its limit (in the current language), with what the limit
    stopped in it."""
    if cut:
        return i18n.label("limits.step_cut", label=label, limit=limit, cut="; ".join(cut))
    return i18n.label("limits.step", label=label, limit=limit)


def step_label(step) -> str:
    """How a verdict names a step or an advanced check: "step 4", "advanced check <id>"."""
    if step.number is not None:
        return i18n.label("report.step", number=step.number)
    return i18n.label("limits.advanced_label", name=step.slug)


class StepClock:
    """The time limit of the check being run, and what each step has spent of its own limit."""

    def __init__(self, override: float | None = None):
        self.override = override
        self._spent: dict = {}
        self._key = None
        self._label = ""
        self._limit = 0.0
        self._deadline: float | None = None
        self._cut: list[str] = []       # what the limit stopped in the current phase
        self._shield = 0
        self._overdue = False           # the alarm came while shielded: fire it when the shield is left
        self._alarmed = False           # the alarm's handler is installed (main thread, in a phase)
        self._exit_site = None          # (frame, instruction) that called the last shield's __exit__

    # -- the current phase --------------------------------------------------------------------
    def limit_of(self, step) -> float:
        return float(self.override if self.override is not None else step.timeout)

    @contextlib.contextmanager
    def phase(self, key, label: str, limit: float, *, alarm_grace: float = 0.0):
        """Time one pytest phase (setup or call) of a check against its step's limit.

        `alarm_grace` delays the alarm past the deadline (setup: the runner enforces the deadline on
        learner runs; the alarm there is only a backstop against a harness hang)."""
        self._key, self._label, self._limit = key, label, limit
        self._cut = []
        started = time.monotonic()
        self._deadline = started + max(0.0, limit - self._spent.get(key, 0.0))
        try:
            with self._alarm(self._deadline + alarm_grace):
                yield
        finally:
            self._spent[key] = self._spent.get(key, 0.0) + time.monotonic() - started
            self._deadline = None

    def remaining(self) -> float | None:
        """Seconds the current step has left, or None outside a timed phase."""
        if self._deadline is None:
            return None
        return self._deadline - time.monotonic()

    def spent(self, key) -> float:
        return self._spent.get(key, 0.0)

    def over(self, key, limit: float) -> bool:
        return self._spent.get(key, 0.0) > limit or bool(self._cut)

    def cut(self, what: str) -> None:
        """A learner run was stopped because the step's time ran out (called by the runner)."""
        self._cut.append(what)

    def message(self) -> str:
        return describe_limit(self._label, self._limit, self._cut)

    # -- enforcement in check code --------------------------------------------------------------
    def shielded(self) -> "_Shield":
        """A learner run is in progress: it is bounded by `remaining()` and stops itself."""
        return _Shield(self)

    def _on_alarm(self, signum, frame) -> None:
        """SIGALRM: the step's time is up. Inside a shield, or on the way out of one, the alarm is
        put off until the code after the shield's `with` statement runs."""
        if self._shield:
            self._overdue = True     # the shield's exit arms the alarm again
            return
        if _leaving(frame, self._exit_site):
            signal.setitimer(signal.ITIMER_REAL, _SOON)
            return
        raise StepTimeLimit(self.message(), self._key)

    @contextlib.contextmanager
    def _alarm(self, at: float):
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
            yield  # no signals here: learner runs are still bounded, and overruns are judged after
            return
        self._overdue = False
        previous = signal.signal(signal.SIGALRM, self._on_alarm)
        started = time.monotonic()
        other, _ = signal.setitimer(signal.ITIMER_REAL, max(0.001, at - started))
        self._alarmed = True
        try:
            yield
        finally:
            self._alarmed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if other:  # someone else's timer (e.g. a test runner's) was running: give it back
                signal.setitimer(signal.ITIMER_REAL, max(0.001, other - (time.monotonic() - started)))


class _Shield:
    """`with clock.shielded():` - the alarm waits while the block runs, and fires after the `with`
    statement if the step's time ran out meanwhile.

    Why the exit is guarded: a Python signal handler runs at the next check of the interpreter's
    eval loop, and one such check comes right after `__exit__` returns, still inside the caller's
    `with` statement. An alarm raised there leaves the `with` as if from inside the shielded block,
    so a `try` around the block catches it: the step's one alarm is spent and the code after runs on
    without a limit (test_the_alarm_waits_while_a_learner_run_stops_itself_then_fires failed so,
    'DID NOT RAISE'). The handler therefore also waits while the interrupted frame is this exit or
    the caller still at the call to it (`_leaving`)."""

    __slots__ = ("clock",)

    def __init__(self, clock: StepClock):
        self.clock = clock

    def __enter__(self) -> None:
        self.clock._shield += 1

    def __exit__(self, *exc) -> None:
        clock = self.clock
        caller = sys._getframe(1)
        clock._exit_site = (caller, caller.f_lasti)
        clock._shield -= 1
        if not clock._shield and clock._overdue and clock._alarmed:
            clock._overdue = False
            signal.setitimer(signal.ITIMER_REAL, _SOON)


_EXIT_CODE = _Shield.__exit__.__code__


def _leaving(frame, exit_site) -> bool:
    """Whether `frame` (where a signal handler interrupted) is a shield's exit, or the caller of the
    last shield exit still at the instruction that called it."""
    if frame is None:
        return False
    if frame.f_code is _EXIT_CODE:
        return True
    return exit_site is not None and frame is exit_site[0] and frame.f_lasti == exit_site[1]
