"""retrylab.background (work beside a learner run) and retrylab.early (an exercise's runs started side by
side when a grading begins): results and errors come back to the caller, nothing outlives the session."""
from __future__ import annotations

import signal
import threading
import time
from types import SimpleNamespace

import pytest

from retrylab import background, early
from retrylab.background import Beside, without_step_clock
from retrylab.early import EarlyRuns


def test_beside_returns_the_value_and_reraises_the_error_in_the_caller():
    assert Beside(lambda cancelled: 42, "t").result() == 42
    with pytest.raises(ZeroDivisionError):
        Beside(lambda cancelled: 1 / 0, "t").result()


def test_beside_as_a_context_stops_and_joins_the_work():
    seen = []
    with Beside(lambda cancelled: seen.append(cancelled.wait(10)), "t"):
        pass
    assert seen == [True]


def test_beside_shares_a_callers_cancel_event_and_cancel_waits_without_raising():
    shared = threading.Event()
    seen = []

    def work(cancelled):
        seen.append(cancelled.wait(10))
        raise RuntimeError("after being cancelled")

    beside = Beside(work, "t", shared)
    assert beside.cancelled is shared
    shared.set()                     # set by the caller's other work: this one ends too
    beside.join()
    assert seen == [True]
    beside.cancel()                  # a finalizer, a path already raising: the work's error is not raised here
    with pytest.raises(RuntimeError):
        beside.result()


@pytest.fixture
def released():
    """An event the test's stuck work waits on, set at the end so that no thread is left blocked."""
    event = threading.Event()
    yield event
    event.set()


def test_work_that_does_not_end_once_cancelled_is_named_not_waited_for_forever(monkeypatch, released):
    # a thread stuck for good (seen: a Python 3.11 import lock left held by a Ctrl-C) must not hang the grading:
    # stop() names it; cancel(), which runs on paths already raising, says so without raising
    monkeypatch.setattr(background, "STOP_WAIT", 0.3)
    stuck = Beside(lambda cancelled: released.wait(), "retrylab-stuck")
    began = time.monotonic()
    with pytest.raises(background.StuckWork, match="retrylab-stuck"):
        stuck.stop()
    assert stuck.cancel() is False
    assert time.monotonic() - began < 5


def test_an_early_run_that_does_not_end_does_not_keep_the_others_from_being_waited_for(monkeypatch, released):
    monkeypatch.setattr(background, "STOP_WAIT", 0.3)
    ended = threading.Event()

    def slow_to_stop(cancelled):
        cancelled.wait(60)
        time.sleep(0.2)
        ended.set()
    started = {"stuck": Beside(lambda cancelled: released.wait(), "stuck"), "slow": Beside(slow_to_stop, "slow")}
    early._stop(started)
    assert ended.is_set()


def test_a_ctrl_c_while_waiting_does_not_make_running_work_look_ended():
    # Python 3.11's Thread.join() marks a live thread as ended when a KeyboardInterrupt lands in it: an interrupted
    # grading then exited while an early run was still in its sandbox, and left its copy of the submission behind
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    finished = threading.Event()

    def work(cancelled):
        cancelled.wait(60)
        time.sleep(0.3)     # cleaning up after being cancelled
        finished.set()

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        beside = Beside(work, "t")
        with pytest.raises(KeyboardInterrupt):
            threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()
            beside.result()
    finally:
        signal.signal(signal.SIGINT, previous)
    beside.cancel()
    assert finished.is_set(), "cancel() returned while the work was still cleaning up"


def test_the_bound_starts_only_once_the_work_is_cancelled(monkeypatch):
    # result() of work nobody cancelled waits as long as the work takes (a learner run's own timeout bounds it)
    monkeypatch.setattr(background, "STOP_WAIT", 0.1)
    assert Beside(lambda cancelled: time.sleep(0.8) or "done", "t").result() == "done"


def test_without_step_clock_leaves_the_original_runner_alone():
    learner = SimpleNamespace(clock="step clock", submission="s")
    alone = without_step_clock(learner)
    assert alone.clock is None and learner.clock == "step clock" and alone.submission == "s"


class _Request:
    """What EarlyRuns reads of a pytest request: the config's stash, the session's items, finalizers."""
    def __init__(self, fixtures):
        self.config = SimpleNamespace(stash=pytest.Stash())
        self.session = SimpleNamespace(items=[SimpleNamespace(fixturenames=fixtures)])
        self.finalizers = []

    def addfinalizer(self, fn):
        self.finalizers.append(fn)


def _runs():
    runs, started = EarlyRuns("t"), []

    for name in ("a_run", "b_run", "c_run"):
        @runs.observer(name)
        def observe(learner, backend, cancelled, name=name):
            span = [time.monotonic()]           # when it began, then when it ended
            started.append((name, span, threading.current_thread().name))
            cancelled.wait(0.3)
            span.append(time.monotonic())
            return name
    return runs, started


def test_the_runs_the_checks_need_start_together_and_their_records_come_back():
    runs, started = _runs()
    request = _Request(["a_run", "b_run"])
    backend = SimpleNamespace(independent_privates=True)
    runs.start_all(request, SimpleNamespace(clock=None), backend)
    assert runs.record(request, "a_run", None, backend) == "a_run"
    assert runs.record(request, "b_run", None, backend) == "b_run"
    (_, a, _), (_, b, _) = sorted(started)
    assert a[0] < b[1] and b[0] < a[1]              # side by side: each began before the other ended
    assert sorted(name for name, _, _ in started) == ["a_run", "b_run"]   # c_run: no check needs it
    assert all(thread != threading.main_thread().name for _, _, thread in started)
    for finalizer in request.finalizers:
        finalizer()


def test_a_backend_without_independent_servers_makes_each_run_when_asked():
    runs, started = _runs()
    request = _Request(["a_run", "b_run"])
    runs.start_all(request, SimpleNamespace(clock=None), SimpleNamespace(independent_privates=False))
    assert started == []
    assert runs.record(request, "b_run", None, None) == "b_run"
    assert [name for name, _, _ in started] == ["b_run"]


def test_the_sessions_end_stops_runs_still_going():
    runs = EarlyRuns("t")
    stopped = threading.Event()

    @runs.observer("slow_run")
    def slow(learner, backend, cancelled):
        cancelled.wait(30)
        stopped.set()

    @runs.observer("other_run")
    def other(learner, backend, cancelled):
        return None

    request = _Request(["slow_run", "other_run"])
    runs.start_all(request, SimpleNamespace(clock=None), SimpleNamespace(independent_privates=True))
    began = time.monotonic()
    for finalizer in request.finalizers:
        finalizer()
    assert stopped.is_set() and time.monotonic() - began < 5
