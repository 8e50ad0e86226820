"""Times of the learner's calls, on the run's two clocks.

A Call's `t` is the shared virtual clock when the call reached the harness, `offset` that clock's offset
then: `t - offset` is the real time of the call, comparable with the relay's real times (a Produce's `at`)
and with a ClockView's advances."""
from __future__ import annotations


def real_time(call) -> float:
    return call.t - (call.offset or 0.0)


def own_wait(view, earlier, until: float) -> float:
    """Seconds a script waited from one of its calls to a real time (its next call, a Produce the relay
    read): the real time between them plus the virtual seconds its own sleeps (its ClockView's advances)
    moved the clock meanwhile; never the other script's."""
    start = real_time(earlier)
    return max(0.0, until - start) + view.advanced_between(start, until)


def first_failure(calls) -> object | None:
    return next((c for c in calls if c.outcome == "error"), None)
