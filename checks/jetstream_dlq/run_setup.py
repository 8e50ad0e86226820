"""Steps 1 and 2's run: setup.py, twice, on a private nats-server where the harness made stream EVENTS.

What the checks read: ConsumerInfo of worker-consumer and StreamInfo of DLQ after the first run, and after
the second (running setup.py twice must be harmless: no failure, the same consumer).

The runs that go on to the worker (run_main, run_late_service, run_two_workers) run setup.py here too, then
publish the lab's events with publish_after_setup."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from retrylab.brokers.nats.admin import NatsError
from retrylab.checks.jetstream_dlq import lab, server
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.checks.jetstream_dlq.lab import DLQ_STREAM
from retrylab.checks.jetstream_dlq.runs import RUNS
from retrylab.fixtures.jetstream_dlq import events
from retrylab.runner import ScriptRun
from retrylab.settle import Reason, never, when
from retrylab.verdict import fail

SETUP_TIMEOUT = 10.0    # real seconds: setup.py makes a few requests and exits


@dataclass(frozen=True)
class SetupRun:
    first: ScriptRun
    second: ScriptRun | None
    consumer: dict | None           # ConsumerInfo of worker-consumer after the first run
    consumer_again: dict | None     # after the second
    dlq: dict | None                # StreamInfo of DLQ after the first run
    streams: tuple[str, ...]        # every stream after the first run
    consumers: tuple[str, ...]      # every consumer on EVENTS after the first run


def run_setup_script(learner, endpoint, cancelled) -> ScriptRun:
    """setup.py, once (it is a one-shot script: bounded by SETUP_TIMEOUT)."""
    stop = when(lambda progress: cancelled.is_set(), Reason.CANCELLED) if cancelled is not None else never()
    return learner.run("setup.py", endpoint, timeout=SETUP_TIMEOUT, stop_when=stop)


def publish_after_setup(admin, created: dict, batch) -> dict[str, int]:
    """Publish the lab's events on events.created once setup.py has run: event id -> its sequence in EVENTS.

    A learner's setup.py that deleted, re-subjected, sealed or otherwise changed EVENTS (the harness `created`
    it) leaves nowhere for the events to go: every step that runs the worker fails, saying so, rather than
    the harness erroring out. A failure the server's state does not put down to the learner (EVENTS as the
    harness made it, a server that stopped answering) stays the harness's error."""
    seqs = {}
    for event in batch:
        try:
            ack = admin.js_publish(lab.SUBJECT, events.payload(event))
        except NatsError as exc:
            refusal = server.refused_by(admin, created, exc)
            if refusal is None:
                raise
        else:
            refusal = server.taken_elsewhere(ack)
        if refusal is not None:
            fail(refusal_message(refusal))
        seqs[event["id"]] = ack["seq"]
    return seqs


def refusal_message(refusal: server.Refusal) -> str:
    """What the learner reads for a Refusal: what became of EVENTS, then what setup.py must do instead."""
    names = dict(stream=lab.STREAM, subject=lab.SUBJECT)
    what = tr(f"publish.{refusal.kind}", **names, subjects=", ".join(refusal.subjects) or "-", other=refusal.other,
              changes="; ".join(refusal.changes), error=refusal.error)
    return f"{what} {tr('publish.must', **names, subjects=', '.join(lab.STREAM_SUBJECTS))}"


@RUNS.observer("setup_run")
def observe_setup(learner, nats_backend, cancelled=None) -> SetupRun:
    with nats_backend.private() as endpoint, endpoint.admin() as admin:
        server.create_events_stream(admin)
        first = run_setup_script(learner, endpoint, cancelled)
        consumer = server.consumer_info(admin)
        dlq = server.stream_info(admin, DLQ_STREAM)
        streams = tuple(server.stream_names(admin))
        consumers = tuple(server.consumer_names(admin, "EVENTS"))
        second = None if first.missing else run_setup_script(learner, endpoint, cancelled)
        again = server.consumer_info(admin) if second is not None else None
    return SetupRun(first=first, second=second, consumer=consumer, consumer_again=again, dlq=dlq,
                    streams=streams, consumers=consumers)


@pytest.fixture(scope="session")
def setup_run(request, learner, nats_backend) -> SetupRun:
    return RUNS.record(request, "setup_run", learner, nats_backend)
