"""Advanced two-workers' run: two worker.py processes side by side on one consumer.

On a private nats-server of its own: the harness makes stream EVENTS, runs setup.py, publishes GOODS good
events, then starts worker.py twice at once (one run beside the other, one TaskprocApp deciding for both).
The goods are published first so a worker that exits once drained finds work; which worker gets which is
the server's business (one may get them all): each must be processed once across both, and acked.
The runs end once the consumer has nothing pending or unacknowledged and SETTLE has passed (a second
processing would be called by then), after QUIET without a new call, or at TIMEOUT.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from retrylab.background import Beside, without_step_clock
from retrylab.checks.jetstream_dlq import server
from retrylab.checks.jetstream_dlq.run_late_service import idle_cpu
from retrylab.checks.jetstream_dlq.run_setup import publish_after_setup, run_setup_script
from retrylab.checks.jetstream_dlq.runs import RUNS
from retrylab.fixtures.jetstream_dlq import events
from retrylab.fixtures.jetstream_dlq.taskproc_app import TaskprocApp
from retrylab.runner import ScriptRun
from retrylab.settle import Reason, no_progress, when

GOODS = 6
TIMEOUT = 8.0           # real seconds: the reference needs about 1.5
SETTLE = 0.4
QUIET = 2.0
STUCK_CPU = 3.0
ASK_EVERY = 0.1         # real seconds between two ConsumerInfo requests (the runner asks every 20 ms)


@dataclass(frozen=True)
class TwoWorkersRun:
    published: tuple[dict, ...]
    seqs: dict[str, int]
    setup: ScriptRun
    workers: tuple[ScriptRun, ...]      # both runs of worker.py
    consumer: dict | None               # ConsumerInfo of worker-consumer at the end

    @property
    def calls(self) -> list:
        return [c for w in self.workers for c in w.calls]

    def call_counts(self) -> Counter:
        return Counter(c.id for c in self.calls)


def _settled(admin, cancelled, finished: threading.Event):
    """The first worker's stop condition; `finished` tells the second to stop at the same moment."""
    state = {"clean_at": None, "calls": None, "since": time.monotonic(), "asked_at": 0.0}

    def clean(progress) -> bool:
        if time.monotonic() - state["asked_at"] < ASK_EVERY:
            return False
        state["asked_at"] = time.monotonic()
        info = server.consumer_info(admin)
        if info is None or info.get("num_pending") or info.get("num_ack_pending"):
            state["clean_at"] = None
            return False
        state["clean_at"] = state["clean_at"] or time.monotonic()
        return time.monotonic() - state["clean_at"] >= SETTLE

    def quiet(progress) -> bool:
        now, count = time.monotonic(), len(progress.calls())
        if count != state["calls"]:
            state["calls"], state["since"] = count, now
        return now - state["since"] >= QUIET

    def noted(condition):
        def predicate(progress) -> bool:
            if condition(progress):
                finished.set()
            return finished.is_set()
        return predicate

    return (when(lambda progress: cancelled.is_set(), Reason.CANCELLED) | when(noted(clean), Reason.DONE_IDLE, idle_cpu)
            | when(noted(quiet), Reason.DONE_IDLE, idle_cpu) | no_progress(cpu=STUCK_CPU))


@RUNS.observer("two_workers_run")
def observe_two_workers(learner, nats_backend, cancelled=None) -> TwoWorkersRun:
    batch = [events.new_event("good") for _ in range(GOODS)]
    cancelled = cancelled or threading.Event()
    app = TaskprocApp(published=batch)
    with nats_backend.private() as endpoint, endpoint.admin() as admin:
        created = server.create_events_stream(admin)
        setup = run_setup_script(learner, endpoint, cancelled)
        seqs = publish_after_setup(admin, created, batch)
        finished = threading.Event()    # both runs are stopped together: their stops take their time at once
        other = Beside(lambda stop: without_step_clock(learner).run(
            "worker.py", endpoint, timeout=TIMEOUT + 2, app=app,
            stop_when=when(lambda progress: finished.is_set(), Reason.DONE_IDLE, idle_cpu)
            | when(lambda progress: stop.is_set() or cancelled.is_set(), Reason.CANCELLED)),
            "retrylab-second-worker")
        try:
            with endpoint.admin() as progress_admin:
                first = learner.run("worker.py", endpoint, timeout=TIMEOUT, app=app,
                                    stop_when=_settled(progress_admin, cancelled, finished))
        finally:
            other.cancel()      # waited for on every path: nothing of its run outlives the private server
        return TwoWorkersRun(published=tuple(batch), seqs=seqs, setup=setup, workers=(first, other.result()),
                             consumer=server.consumer_info(admin))


@pytest.fixture(scope="session")
def two_workers_run(request, learner, nats_backend) -> TwoWorkersRun:
    return RUNS.record(request, "two_workers_run", learner, nats_backend)
