"""Step 1's run: consumer.py on a Redis where the stream exists but group `workers` does not.

The stream is made empty (an entry added and deleted), so a consumer may create the group with start id
`0` or `$`, with or without MKSTREAM. The harness adds the orders only once the group exists (LAB.md:
`$` is fine if created before the harness publishes), or after GROUP_WAIT if it never appears.
"""
from __future__ import annotations

import time
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

ORDERS = 5
GROUP_WAIT = 3.0        # real seconds the harness waits for consumer.py to create the group


@dataclass(frozen=True)
class ConsumeRun:
    seeded: tuple[dict, ...]
    run: ScriptRun
    group_made: bool            # the group existed before the harness added the orders
    group: streams.GroupState | None
    pending: tuple[streams.Pending, ...]
    seeded_ids: tuple[bytes, ...]


def _seed_when_group_exists(client, batch, cancelled) -> tuple[bool, list[bytes]]:
    deadline = time.monotonic() + GROUP_WAIT
    made = False
    while not cancelled.is_set() and time.monotonic() < deadline:
        if streams.group(client) is not None:
            made = True
            break
        time.sleep(0.02)
    if cancelled.is_set():
        return made, []
    return made, streams.seed(client, batch)


def _done(batch):
    ids = {o["order_id"] for o in batch}

    def done(progress) -> bool:
        applied = {c.id for c in progress.calls() if c.outcome == "ok"}
        if not ids <= applied:
            return False
        state = streams.group(progress.link.client)
        return state is not None and state.pending == 0 and state.undelivered == 0

    return done


@RUNS.observer("consume_run")
def observe_consume(learner, redis_backend, cancelled) -> ConsumeRun:
    batch = orders.batch(*["ok"] * ORDERS)
    with redis_backend.private() as endpoint, endpoint.client() as client:
        placeholder = client.xadd(lab.STREAM, {"placeholder": "1"})
        client.xdel(lab.STREAM, placeholder)
        with Beside(lambda stop: _seed_when_group_exists(client, batch, stop), "retrylab-seed") as seeder:
            run = learner.run("consumer.py", endpoint, timeout=RUN_TIMEOUT,
                              stop_when=consumer_settled(_done(batch), cancelled),
                              app=EffectsApp(seeded=batch), run_clock=RunClock.real())
            seeder.cancelled.set()
            made, ids = seeder.result()
        return ConsumeRun(seeded=tuple(batch), run=run, group_made=made, group=streams.group(client),
                          pending=tuple(streams.pending(client)), seeded_ids=tuple(ids))


@pytest.fixture(scope="session")
def consume_run(request, learner, redis_backend):
    return RUNS.record(request, "consume_run", learner, redis_backend)
