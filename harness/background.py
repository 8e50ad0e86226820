"""The harness's own work beside a learner run (seeding a stream when the consumer is ready, sampling
a lag, listening to a broker's advisories, a second learner script): a thread whose result or exception
comes back to the check, and which is always stopped and joined before the run's private server goes away.

Whether the work has ended is an event of its own, set when the work returns or raises, not Thread.is_alive():
in Python 3.11 a Ctrl-C landing in Thread.join() marks a thread that is still running as ended (the bpo-45274
handling in _wait_for_tstate_lock releases the running thread's own lock). An interrupted grading then went on
to exit while an early run was still in its sandbox, and left the run's copy of the submission behind.

A thread that does not stop is a harness defect, and waiting for it must not hang the grading: once the work is
cancelled, the wait is STOP_WAIT seconds at most. stop() and result() then raise StuckWork (the caller wanted the
result); cancel() returns False and raises nothing, since it runs in finalizers and on paths already raising (a
Ctrl-C, a step's time limit), whose exception must go on. One such defect was seen: in Python 3.11 a module's import
lock is left held for good when a signal (Ctrl-C, SIGTERM) lands in a thread just as it is woken to take that lock
from another thread importing the same module; the next thread to wait for it waits forever. Modules a beside
thread may import first are therefore imported before the threads start (the brokers' endpoints do), and an
interrupted grading still ends in time if one is missed."""
from __future__ import annotations

import contextvars
import copy
import threading
import time


STOP_WAIT = 60.0    # seconds a cancelled work may take to end: a learner run stops within a poll, a harness client's
                    # call within its own timeout (10 s at most). A container that is being started when its run is
                    # cancelled can take longer: cancel() then stops waiting, and the daemon thread ends with the process


class StuckWork(RuntimeError):
    """Work beside a run that did not end STOP_WAIT seconds after it was cancelled (a harness defect)."""

    def __init__(self, name: str):
        super().__init__(f"the harness's work beside the run ({name}) did not end within {STOP_WAIT:.0f} s of "
                         f"being cancelled: a harness defect")


class Beside:
    """`work(cancelled)` in a thread of its own. `result()` waits and returns its value (or raises its
    exception) in the caller's thread; `stop()` sets `cancelled` and waits for the result; `cancel()` sets it
    and waits, whatever the outcome and without raising (a finalizer, a path already raising). `cancelled`: an
    event the caller shares with other work (set by either), else one of its own."""

    def __init__(self, work, name: str, cancelled: threading.Event | None = None):
        self.cancelled = cancelled or threading.Event()
        self._outcome: dict = {}
        self._ended = threading.Event()

        def target():
            try:
                self._outcome["value"] = work(self.cancelled)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the thread that asks for the result
                self._outcome["error"] = exc
            finally:
                self._ended.set()

        # in a copy of the caller's context: what the work says is in the grading's language
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(target,), name=name, daemon=True)
        self._thread.start()

    def result(self):
        self.join()
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]

    def stop(self):
        self.cancelled.set()
        return self.result()

    def cancel(self) -> bool:
        """Set `cancelled` and wait for the work to end, STOP_WAIT seconds at most: False if it did not."""
        self.cancelled.set()
        return self._ended.wait(STOP_WAIT)

    def join(self) -> None:
        """Wait for the work: as long as it takes until it is cancelled, then STOP_WAIT seconds more at most."""
        while not self._ended.is_set() and not self.cancelled.is_set():
            self._ended.wait(0.5)
        if not self._ended.wait(STOP_WAIT):
            raise StuckWork(self._thread.name)

    def __enter__(self) -> "Beside":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


def join_all(threads, budget: float) -> None:
    """Join `threads` within `budget` seconds in all: a relay's close(). The calling thread is skipped (close() may
    run on one of them), and so is a thread not alive: a relay lists a thread for its close() before starting it,
    and close() can come in between (another thread closing, or a Ctrl-C landing in start() on the main thread).
    join() would raise RuntimeError ("cannot join thread before it is started"), and an interrupted grading would
    report a harness error instead of the interruption. A thread not alive has nothing to wait for: ended, or not
    started (it then finds its listener closed, or never runs)."""
    deadline = time.monotonic() + budget
    for thread in threads:
        if thread is not threading.current_thread() and thread.is_alive():
            thread.join(max(0.0, deadline - time.monotonic()))


def without_step_clock(learner):
    """The learner runner without the current step's time limit (that clock belongs to the main thread):
    for a learner run in a thread beside the main one, bounded by its own timeout."""
    alone = copy.copy(learner)
    alone.clock = None
    return alone
