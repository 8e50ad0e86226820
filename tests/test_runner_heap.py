"""While learner runs go on, the collector leaves the grading process's older objects alone (runner._heap_frozen):
a full collection would hold the relay and the application channel, threads of this process, for as long as it
walks the heap, and stretch the learner's waits that steps compare."""
from __future__ import annotations

import gc
import threading

import pytest

from retrylab import runner
from retrylab.brokers.redis.backends import make_backend
from retrylab.runner import LearnerRunner
from retrylab.settle import StopCondition

from helpers import wait_until


@pytest.fixture(autouse=True)
def _no_frozen_heap_around():
    # runs of an earlier test that are still ending (in threads beside it) hold the heap frozen until they end
    wait_until(lambda: runner._frozen_by_runs[0] == 0, "earlier learner runs in this process to end")
    gc.unfreeze()       # start from nothing frozen
    yield
    gc.unfreeze()


class _NotesFrozen(StopCondition):
    """Never stops a run; notes how many objects were frozen at each look."""

    def __init__(self):
        self.seen: list[int] = []

    def check(self, progress):
        self.seen.append(gc.get_freeze_count())
        return None


def test_a_run_freezes_the_older_heap_while_it_goes_on_and_unfreezes_it_after(tmp_path):
    (tmp_path / "worker.py").write_text("import time, redis\nredis.Redis().set('k', 'v')\ntime.sleep(0.3)\n")
    ballast = [[i] for i in range(50_000)]     # tracked objects the grading had before the run
    backend = make_backend("fake")
    backend.start()
    try:
        with backend.private() as endpoint:
            looks = _NotesFrozen()
            run = LearnerRunner(tmp_path).run("worker.py", endpoint, timeout=20, stop_when=looks)
    finally:
        backend.stop()
    assert run.result.reason == "exited", run.result.describe()
    assert looks.seen and min(looks.seen) >= len(ballast)
    assert gc.get_freeze_count() == 0


def test_overlapping_runs_keep_it_frozen_until_the_last_one_ends():
    done, started = threading.Event(), threading.Event()

    def beside():
        with runner._heap_frozen():
            started.set()
            done.wait(10)

    thread = threading.Thread(target=beside)
    try:
        with runner._heap_frozen():        # the step's run
            assert gc.get_freeze_count() > 0
            thread.start()
            started.wait(10)
        # the step's run ended; the one beside it goes on (not ">= what was frozen": a frozen object that loses
        # its last reference leaves the frozen generation)
        assert gc.get_freeze_count() > 0
    finally:
        done.set()
        if thread.ident is not None:
            thread.join()
    assert gc.get_freeze_count() == 0
    with runner._heap_frozen():            # and the next run freezes again
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_itself_keeps_them_frozen():
    gc.freeze()
    frozen = gc.get_freeze_count()
    with runner._heap_frozen():
        pass
    assert gc.get_freeze_count() >= frozen > 0
