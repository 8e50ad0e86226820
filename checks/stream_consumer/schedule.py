"""Starting stream-consumer's learner runs early, side by side, each on its own private Redis.

Every check of this exercise reads the record of one run (run_*.py), and the runs do not depend on
each other. Made one after another they would take the sum of their real-time waits (min-idle times,
a burst drained at a fixed pace); started together when the grading begins they take about as long
as the longest. The runs are on real time, so what they measure (gaps between deliveries, a lag
series against the harness's samples) is judged with tolerances that a busy machine stays inside.

A run fixture asks `record(request, name, observe)`: the early run's record if the grading started it,
else the run made there and then (a backend whose private servers cannot be used at once, or a
grading of one step). A run started early is bounded by its own timeouts; the step that asks for its
record is bounded by its step's time limit, and every run still going is stopped when the session ends.
"""
from __future__ import annotations

import threading
from typing import Callable

import pytest

from retrylab.checks.stream_consumer.background import Beside, without_step_clock

_STARTED = pytest.StashKey[dict]()
# fixture name -> how to make its record: observe(learner, redis_backend, cancelled)
_OBSERVERS: dict[str, Callable] = {}


def observer(name: str):
    """Register `observe(learner, redis_backend, cancelled)` as the maker of run fixture `name`."""
    def register(observe):
        _OBSERVERS[name] = observe
        return observe
    return register


def start_all(request, learner, redis_backend) -> None:
    """Start, beside each other, the runs the collected checks need (once per session)."""
    config = request.config
    if _STARTED in config.stash:
        return
    started: dict[str, Beside] = {}
    config.stash[_STARTED] = started
    if not redis_backend.independent_privates:
        return
    wanted = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
    names = [name for name in _OBSERVERS if name in wanted]
    if len(names) < 2:
        return
    alone = without_step_clock(learner)
    for name in names:
        observe = _OBSERVERS[name]
        started[name] = Beside(lambda cancelled, observe=observe: observe(alone, redis_backend, cancelled),
                               f"retrylab-{name}")
    request.addfinalizer(lambda: _stop(started))


def _stop(started: dict[str, Beside]) -> None:
    """Nothing of a run outlives the grading (its private Redis, its learner processes)."""
    for run in started.values():
        run.cancelled.set()
    for run in started.values():
        run.join()


@pytest.fixture(scope="session", autouse=True)
def _start_runs(request, learner, redis_backend):
    start_all(request, learner, redis_backend)


def record(request, name: str, learner, redis_backend):
    """The record of run `name`: the early run's, or one made now."""
    early = request.config.stash.get(_STARTED, {}).get(name)
    if early is not None:
        return early.result()
    return _OBSERVERS[name](learner, redis_backend, threading.Event())
