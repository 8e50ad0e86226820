"""Starting an exercise's learner runs early, side by side, each on its own private server.

In an exercise whose waits are real (a broker's redelivery delays, min-idle times), every check reads the
record of one run, and the runs do not depend on each other. Made one after another they take the sum of their real-time waits;
started together when the grading begins they take about as long as
the longest.

An exercise makes one `EarlyRuns`, registers each run's maker with `@runs.observer("fixture_name")`
(`observe(learner, backend, cancelled)`, returning the run's record), calls `runs.start_all(request,
learner, backend)` from a session fixture of its own (autouse), and has each run fixture return
`runs.record(request, "fixture_name", learner, backend)`: the early run's record if the grading started it,
else one made there and then (a backend whose private servers cannot be used at once, or a grading that
needs only one run). A run started early is bounded by its own timeouts, the step that asks for its
record by its step's time limit, and every run still going is stopped when the session ends.
"""
from __future__ import annotations

import threading
from typing import Callable

import pytest

from retrylab.background import Beside, without_step_clock


class EarlyRuns:
    def __init__(self, name: str):
        self._observers: dict[str, Callable] = {}
        self._key = pytest.StashKey[dict]()
        self.name = name

    def observer(self, fixture: str):
        """Register `observe(learner, backend, cancelled)` as the maker of run fixture `fixture`."""
        def register(observe):
            self._observers[fixture] = observe
            return observe
        return register

    def start_all(self, request, learner, backend) -> None:
        """Start, beside each other, the runs the collected checks need (once per session)."""
        config = request.config
        if self._key in config.stash:
            return
        started: dict[str, Beside] = {}
        config.stash[self._key] = started
        if not backend.independent_privates:
            return
        wanted = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
        names = [name for name in self._observers if name in wanted]
        if len(names) < 2:
            return
        alone = without_step_clock(learner)
        request.addfinalizer(lambda: _stop(started))    # first: a Ctrl-C between two starts stops the first
        for name in names:
            observe = self._observers[name]
            started[name] = Beside(lambda cancelled, observe=observe: observe(alone, backend, cancelled),
                                   f"retrylab-{self.name}-{name}")

    def record(self, request, fixture: str, learner, backend):
        """The record of run `fixture`: the early run's, or one made now."""
        early = request.config.stash.get(self._key, {}).get(fixture)
        if early is not None:
            return early.result()
        return self._observers[fixture](learner, backend, threading.Event())


def _stop(started: dict[str, Beside]) -> None:
    """Nothing of a run outlives the grading (its private server, its learner processes)."""
    for run in started.values():
        run.cancelled.set()    # all at once: their stops take their time together
    for run in started.values():
        run.cancel()           # each waited for, even after one that does not end (a harness defect)
