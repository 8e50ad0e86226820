"""Steps 2 and 3's run: consumer.py on a Redis where the harness made group `workers` at id 0 and added
a few ok orders, one `flaky` (fails its first 2 deliveries), one `poison` (always fails) and ok orders
after them. When the poison's first delivery fails, the harness adds LATE more ok orders (LAB.md step 3:
they must be processed while the poison is still being retried).

The run stops once every ok and flaky order is applied, the poison is in orders:dlq, nothing is pending
or undelivered, and that holds for the grace; or when nothing has changed for settling.QUIET s after every
order was called at least once (a consumer that never XACKs, never dead-letters, or waits for nothing).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from retrylab.background import Beside
from retrylab.appchannel import RunClock
from retrylab.checks.stream_consumer.runs import RUNS
from retrylab.checks.stream_consumer import lab, streams
from retrylab.checks.stream_consumer.settling import RUN_TIMEOUT, consumer_settled
from retrylab.fixtures.stream_consumer import orders
from retrylab.fixtures.stream_consumer.effects_app import EffectsApp
from retrylab.runner import ScriptRun

FIRST_KINDS = ("ok", "ok", "flaky", "poison", "ok", "ok")
LATE = 3                    # ok orders the harness adds once the poison's first delivery failed


@dataclass(frozen=True)
class RetryRun:
    first: tuple[dict, ...]         # what the harness added before the run
    late: tuple[dict, ...]          # what it added after the poison's first failure (() if that never came)
    ids: dict                       # order id -> its entry id in `orders` (bytes)
    run: ScriptRun
    group: streams.GroupState | None
    pending: tuple[streams.Pending, ...]
    dlq_type: str                   # the type of key orders:dlq at the end ("none": missing)
    dlq: tuple[streams.Entry, ...]

    @property
    def seeded(self) -> tuple[dict, ...]:
        return self.first + self.late

    def one(self, kind: str) -> dict:
        return next(o for o in self.first if o["kind"] == kind)

    @property
    def flaky(self) -> dict:
        return self.one("flaky")

    @property
    def poison(self) -> dict:
        return self.one("poison")

    def entry_id(self, order: dict) -> bytes:
        return self.ids[order["order_id"]]

    def pending_entry(self, order: dict) -> streams.Pending | None:
        return next((p for p in self.pending if p.id == self.entry_id(order)), None)


def _add_late(client, late: list[dict], poison_failed: threading.Event, late_added: threading.Event,
              cancelled: threading.Event):
    """Wait for the poison's first failure (told by the effects' hook), then XADD the late orders:
    from this thread, never from the channel's thread (which must answer the learner at once)."""
    while not poison_failed.wait(0.01):
        if cancelled.is_set():
            return []
    ids = streams.seed(client, late)
    late_added.set()
    return ids


def _dlq_has(client, order_id: str) -> bool:
    return any(e.get("order_id") == order_id for e in streams.entries(client, lab.DLQ))


def _done(first: list[dict], late: list[dict], poison_id: str, late_added: threading.Event):
    wanted = {o["order_id"] for o in first + late if o["kind"] != "poison"}

    def done(progress) -> bool:
        if not late_added.is_set():
            return False
        applied = {c.id for c in progress.calls() if c.outcome == "ok"}
        if not wanted <= applied:
            return False
        client = progress.link.client
        state = streams.group(client)
        return (state is not None and state.pending == 0 and state.undelivered == 0
                and _dlq_has(client, poison_id))

    return done


def _ready(first: list[dict], late: list[dict], late_added: threading.Event):
    """Every order the harness has added so far was called at least once."""
    def ready(progress) -> bool:
        added = first + late if late_added.is_set() else first
        called = {c.id for c in progress.calls()}
        return all(o["order_id"] in called for o in added)

    return ready


@RUNS.observer("retry_run")
def observe_retry(learner, redis_backend, cancelled: threading.Event | None = None) -> RetryRun:
    first = orders.batch(*FIRST_KINDS)
    late = orders.batch(*["ok"] * LATE)
    poison_id = next(o["order_id"] for o in first if o["kind"] == "poison")
    poison_failed, late_added = threading.Event(), threading.Event()

    def on_call(order_id: str, failed: bool) -> None:   # on the channel's thread: only set an event
        if failed and order_id == poison_id:
            poison_failed.set()

    app = EffectsApp(seeded=first + late, on_call=on_call)
    with redis_backend.private() as endpoint, endpoint.client() as client:
        streams.create_group(client)
        first_ids = streams.seed(client, first)

        with Beside(lambda stop: _add_late(client, late, poison_failed, late_added, stop),
                    "retrylab-late-orders") as adder:
            stop_when = consumer_settled(_done(first, late, poison_id, late_added), cancelled,
                                         ready=_ready(first, late, late_added))
            run = learner.run("consumer.py", endpoint, timeout=RUN_TIMEOUT, stop_when=stop_when, app=app,
                              run_clock=RunClock.real())
            adder.cancelled.set()
            late_ids = adder.result()
        added_late = tuple(late) if late_ids else ()
        ids = {o["order_id"]: i for o, i in zip(first + list(added_late), list(first_ids) + list(late_ids))}
        return RetryRun(first=tuple(first), late=added_late, ids=ids, run=run,
                        group=streams.group(client), pending=tuple(streams.pending(client)),
                        dlq_type=streams.key_type(client, lab.DLQ), dlq=tuple(streams.entries(client, lab.DLQ)))


@pytest.fixture(scope="session")
def retry_run(request, learner, redis_backend):
    return RUNS.record(request, "retry_run", learner, redis_backend)
