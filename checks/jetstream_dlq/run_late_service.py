"""Advanced late-dlq-service's run: the DLQ service started only after the poison used up its deliveries.

On a private nats-server of its own: the harness makes stream EVENTS, runs setup.py, publishes good, poison,
good, corrupt, and runs worker.py ALONE until the server has published the poison's MAX_DELIVERIES advisory
(the harness listens for it) and both goods were processed; the worker is then stopped. Nobody else heard
the advisory: advisories are core NATS messages. Only then is dlq_service.py started; it runs until the
poison's dead letter is stored and SETTLE has passed (a second copy would be stored by then), or SERVICE_WAIT
has passed without one.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from retrylab.checks.jetstream_dlq import dead_letters, lab, server
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.checks.jetstream_dlq.run_main import CALLS_FOREVER, main_batch
from retrylab.checks.jetstream_dlq.run_setup import publish_after_setup, run_setup_script
from retrylab.checks.jetstream_dlq.runs import RUNS
from retrylab.fixtures.jetstream_dlq import events
from retrylab.fixtures.jetstream_dlq.taskproc_app import TaskprocApp
from retrylab.runner import ScriptRun
from retrylab.settle import Reason, no_progress, when

WORKER_TIMEOUT = 10.0   # real seconds: the advisory comes about 2.7 s after the publishes (BackOff 0.5 s + 1 s)
QUIET = 2.5             # every event processed and nothing new for this long: the advisory is not coming
RETRIES_FOREVER = CALLS_FOREVER     # calls of process for one event: as the main run (a worker may retry in its own loop)
SERVICE_WAIT = 2.5      # real seconds the late service gets to store the dead letter
SETTLE = 0.3            # real seconds after the dead letter is stored: a duplicate (the same advisory handled
                        # twice at start, from a stream and a reconciliation) would be stored by then
STUCK_CPU = 3.0
ASK_EVERY = 0.1         # real seconds between two reads of stream DLQ (the runner asks every 20 ms)


@dataclass(frozen=True)
class LateServiceRun:
    published: tuple[dict, ...]
    seqs: dict[str, int]
    setup: ScriptRun
    worker: ScriptRun
    service: ScriptRun | None           # None: no dlq_service.py, or the advisory never came (not started)
    has_service: bool                   # the submission has a dlq_service.py
    advised_at: float | None            # when the harness received the poison's MAX_DELIVERIES advisory
    dlq: tuple[dict, ...]               # DLQ's messages at the end


class _AdvisorySeen:
    """The harness's subscription to the poison's MAX_DELIVERIES advisory, read from the worker's stop
    condition (the runner's thread, the one that made it)."""

    def __init__(self, admin, poison_seq: int):
        self.admin, self.poison_seq = admin, poison_seq
        self.sid = admin.subscribe(lab.MAX_DELIVERIES_ADVISORY)
        self.at: float | None = None

    def __call__(self) -> bool:
        if self.at is None and any(dead_letters.body(m).get("stream_seq") == self.poison_seq
                                   for m in self.admin.received(self.sid)):
            self.at = time.time()
        return self.at is not None


def idle_cpu(progress) -> str:
    """DONE_IDLE's detail: the CPU seconds the script had since it last changed anything."""
    return f"{progress.cpu_since_change():.2f}"


def _worker_done(batch, seen: _AdvisorySeen, cancelled):
    goods = [e["id"] for e in batch if e["kind"] == "good"]
    ids = [e["id"] for e in batch]
    quiet = {"since": None, "calls": None}

    def done(progress) -> bool:
        ok = {c.id for c in progress.calls() if c.outcome == "ok"}
        return seen() and all(g in ok for g in goods)

    def quiet_enough(progress) -> bool:
        calls = progress.calls()
        if not all(i in {c.id for c in calls} for i in ids):
            return False
        now = time.monotonic()
        if len(calls) != quiet["calls"]:
            quiet["calls"], quiet["since"] = len(calls), now
        return now - quiet["since"] >= QUIET

    def retries_forever(progress) -> bool:
        counts = Counter(c.id for c in progress.calls())
        return bool(counts) and counts.most_common(1)[0][1] > RETRIES_FOREVER

    return (when(lambda progress: cancelled.is_set(), Reason.CANCELLED) | when(done, Reason.DONE_IDLE, idle_cpu)
            | when(quiet_enough, Reason.DONE_IDLE, idle_cpu)
            | when(retries_forever, Reason.CAP, lambda progress: tr("advanced_msg.late-dlq-service.retried",
                                                                    times=RETRIES_FOREVER))
            | no_progress(cpu=STUCK_CPU))


def _service_done(reader, payload: bytes, cancelled):
    started, stored = time.monotonic(), {"at": None, "asked_at": 0.0}

    def dead_lettered(progress) -> bool:
        now = time.monotonic()
        if stored["at"] is None and now - stored["asked_at"] >= ASK_EVERY:
            stored["asked_at"] = now
            if any(m["data"] == payload for m in dead_letters.under(server.messages(reader, lab.DLQ_STREAM),
                                                                      lab.DLQ_SUBJECT)):
                stored["at"] = now
        return stored["at"] is not None and now - stored["at"] >= SETTLE

    return (when(lambda progress: cancelled.is_set(), Reason.CANCELLED)
            | when(dead_lettered, Reason.DONE_IDLE, idle_cpu)
            | when(lambda progress: stored["at"] is None and time.monotonic() - started >= SERVICE_WAIT, Reason.CAP,
                   lambda progress: tr("advanced_msg.late-dlq-service.waited", seconds=SERVICE_WAIT)))


@RUNS.observer("late_service_run")
def observe_late_service(learner, nats_backend, cancelled=None) -> LateServiceRun:
    batch = main_batch()
    cancelled = cancelled or threading.Event()
    with nats_backend.private() as endpoint, endpoint.admin() as admin, endpoint.admin() as listener:
        created = server.create_events_stream(admin)
        setup = run_setup_script(learner, endpoint, cancelled)
        seqs = publish_after_setup(admin, created, batch)
        poison = next(e for e in batch if e["kind"] == "poison")
        seen = _AdvisorySeen(listener, seqs[poison["id"]])
        worker = learner.run("worker.py", endpoint, timeout=WORKER_TIMEOUT,
                             stop_when=_worker_done(batch, seen, cancelled), app=TaskprocApp(published=batch))
        seen()
        service = None
        if seen.at is not None and not cancelled.is_set():
            service = learner.run("dlq_service.py", endpoint, timeout=SERVICE_WAIT + SETTLE + 5,
                                  stop_when=_service_done(admin, events.payload(poison), cancelled),
                                  app=TaskprocApp(published=batch))
        return LateServiceRun(
            published=tuple(batch), seqs=seqs, setup=setup, worker=worker,
            service=None if service is None or service.missing else service,
            has_service=(learner.submission / "dlq_service.py").is_file(), advised_at=seen.at,
            dlq=tuple(server.messages(admin, lab.DLQ_STREAM)))


@pytest.fixture(scope="session")
def late_service_run(request, learner, nats_backend) -> LateServiceRun:
    return RUNS.record(request, "late_service_run", learner, nats_backend)
