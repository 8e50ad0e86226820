"""Steps 1-6's run (and advanced key-order's): consumer.py and retry_consumer.py side by side on a private
broker (pair.py), with one shared virtual clock and one NotifierApp.

Once both consumers fetch, the harness produces, keyed by order id, one record per callback:

    partition 0:  ok, flaky-1, ok
    partition 1:  ok, flaky-2, ok, K paid (flaky-1), K refunded
    partition 2:  down, ok, ok

Every failing callback has callbacks behind it in its partition (step 2). K is a second flaky-1 order with
two callbacks under one key (advanced key-order): its "paid" callback fails once and is retried, its
"refunded" one comes after it. A correct pair makes per order: ok 1 call, flaky-1 2, flaky-2 3, down 3 and
one DLQ record, K 3 calls (paid twice, refunded once).

The run ends (pair.LivePair.settle) when that outcome is complete, with both groups' offsets at the ends of
what they read, and stays so for DONE_SETTLE; when one order was notified more than CALLS_FOREVER times
(retrying without end) or the learner produced more than FLOOD records meanwhile; when nothing changed for a
while; or at SETTLE_LIMIT (MOVING_LIMIT while the clock still moves toward a due time: a pair cut there may
have been still at work, see observe.incomplete). Then the broker is read (every record, committed offsets).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import pytest

from retrylab.checks.retry_topics import lab, pair, records
from retrylab.checks.retry_topics.catalog import tr
from retrylab.checks.retry_topics.clock import ClockView, pair_clocks
from retrylab.checks.retry_topics.runs import RUNS
from retrylab.brokers.kafka.state import KafkaState, read_state
from retrylab.fixtures.retry_topics.callbacks import new_callback
from retrylab.fixtures.retry_topics.notifier_app import NotifierApp
from retrylab.runner import ScriptRun
from retrylab.settle import Stop

CALLS_FOREVER = 2 * lab.MAX_ATTEMPTS    # calls for one order: beyond that the pair retries without end
FLOOD = 100     # records the learner produced, any topic, once the callbacks were (a correct pair: 6 + 1)
REFUNDED = "refunded"


@dataclass(frozen=True)
class Scenario:
    ok: tuple[dict, ...]
    flaky_1: dict
    flaky_2: dict
    down: dict
    keyed: tuple[dict, dict]            # K's "paid" (fails once) and "refunded" (behind it, same key)

    def layout(self) -> list[list[dict]]:
        ok = self.ok
        return [[ok[0], self.flaky_1, ok[1]],
                [ok[2], self.flaky_2, ok[3], *self.keyed],
                [self.down, ok[4], ok[5]]]

    def expected_calls(self) -> dict[str, int]:
        """order id -> notify calls a correct pair makes for it."""
        expected = {c["orderId"]: lab.EXPECTED_CALLS[lab.OK] for c in self.ok}
        expected.update({self.flaky_1["orderId"]: lab.EXPECTED_CALLS[lab.FLAKY_1],
                         self.flaky_2["orderId"]: lab.EXPECTED_CALLS[lab.FLAKY_2],
                         self.down["orderId"]: lab.EXPECTED_CALLS[lab.DOWN],
                         self.keyed[0]["orderId"]: lab.EXPECTED_CALLS[lab.FLAKY_1] + 1})
        return expected


def new_scenario() -> Scenario:
    paid = new_callback(lab.FLAKY_1)
    return Scenario(ok=tuple(new_callback(lab.OK) for _ in range(6)), flaky_1=new_callback(lab.FLAKY_1),
                    flaky_2=new_callback(lab.FLAKY_2), down=new_callback(lab.DOWN),
                    keyed=(paid, new_callback(lab.FLAKY_1, order_id=paid["orderId"], event=REFUNDED)))


@dataclass(frozen=True)
class MainRun:
    scenario: Scenario
    placed: tuple[pair.Placed, ...]
    main: ScriptRun
    retry: ScriptRun
    state: KafkaState | None
    main_clock: ClockView
    retry_clock: ClockView
    fetching: dict                      # script -> real time of its first Fetch (None: never)
    stop: Stop | None                   # why the pair was stopped
    times: pair.PairTimes
    read_seconds: float = 0.0           # reading the broker at the end
    cut: pair.Cut | None = None         # the settle's limit cut the pair while its clock still moved (LivePair)

    @property
    def published(self) -> list[dict]:
        return [p.callback for p in self.placed]

    def placed_of(self, callback: dict) -> pair.Placed | None:
        return next((p for p in self.placed if p.callback is callback), None)

    def behind(self, callback: dict) -> list[dict]:
        """The callbacks produced after `callback` in its partition."""
        own = self.placed_of(callback)
        return [p.callback for p in self.placed if own and p.partition == own.partition and p.offset > own.offset]

    def calls_of(self, callback: dict, run: ScriptRun | None = None) -> list:
        """notify calls (of one script, or of both in time order) whose payload is this callback."""
        runs = [run] if run is not None else [self.main, self.retry]
        found = [c for r in runs for c in r.calls if c.id == callback["orderId"] and _event(c) == callback["event"]]
        return sorted(found, key=lambda c: c.t)

    def records(self, topic: str) -> list[records.LabRecord]:
        if self.state is None:
            return []
        made_by = records.producers({lab.MAIN_SCRIPT: self.main, lab.RETRY_SCRIPT: self.retry})
        return records.on_topic(self.state, topic, self.published, made_by)

    def committed(self, group: str) -> dict[tuple[str, int], int]:
        return dict((self.state.committed if self.state else {}).get(group, {}))

    def due_times(self) -> list[float]:
        """nextRetryTime (virtual epoch seconds) of every record on callbacks.retry."""
        return [r.due for r in self.records(lab.RETRY_TOPIC) if r.due is not None]

    def ends(self) -> dict[tuple[str, int], int]:
        return pair.ends_of(list(self.placed))


def _event(call) -> str | None:
    try:
        payload = json.loads(call.arg)
    except ValueError:
        return None
    return payload.get("event") if isinstance(payload, dict) else None


def _policy(scenario: Scenario, placed: list[pair.Placed], app: NotifierApp):
    expected = scenario.expected_calls()
    ends = pair.ends_of(placed)

    def calls_made(watch) -> bool:
        return all(app.calls[order] >= count for order, count in expected.items()) \
            and bool(pair.produced_ends(watch.requests(), lab.DLQ_TOPIC))

    def done(watch) -> bool:
        if not calls_made(watch):
            return False
        committed = watch.committed()
        retry_ends = pair.produced_ends(watch.requests(), lab.RETRY_TOPIC)
        return all(committed.get((lab.MAIN_GROUP, t, p), -1) >= end for (t, p), end in ends.items()) \
            and all(committed.get((lab.RETRY_GROUP, t, p), -1) >= end for (t, p), end in retry_ends.items())

    before: list[int] = []      # records the scripts had produced when the settling began

    def cap(watch) -> str | None:
        most = max(app.calls.values(), default=0)
        if most > CALLS_FOREVER:
            return tr("main.retries_forever", count=most, most=lab.MAX_ATTEMPTS)
        produced = sum(n for p in list(watch.progress.values()) for n in p.link.relay.produced().values())
        before[:] = before or [produced]
        if produced - before[0] > FLOOD:
            return tr("main.flood", count=produced - before[0], callbacks=len(placed))
        return None

    return done, cap, calls_made


@RUNS.observer("main_run")
def observe_main(learner, kafka_backend, cancelled=None) -> MainRun:
    scenario = new_scenario()
    app = NotifierApp(published=[c for batch in scenario.layout() for c in batch])
    _shared, main_clock, retry_clock = pair_clocks(lab.MAIN_SCRIPT, lab.RETRY_SCRIPT)
    with kafka_backend.private() as endpoint:
        endpoint = pair.learner_endpoint(endpoint)
        pair.create_topics(endpoint)
        with pair.LivePair(learner, endpoint, app, main_clock, retry_clock, cancelled or threading.Event()) as live:
            fetching = live.wait_fetching()
            placed = pair.produce_callbacks(endpoint, scenario.layout())
            done, cap, calls_made = _policy(scenario, placed, app)
            stop = live.settle(done, cap, work_done=calls_made)
            main, retry = live.stop_and_collect(stop)
        began = time.monotonic()
        state = read_state(endpoint) if not (main.missing and retry.missing) else None
        read_seconds = time.monotonic() - began
    return MainRun(scenario=scenario, placed=tuple(placed), main=main, retry=retry, state=state,
                   main_clock=main_clock, retry_clock=retry_clock, fetching=fetching, stop=stop, times=live.times,
                   read_seconds=read_seconds, cut=live.cut)


@pytest.fixture(scope="session")
def main_run(request, learner, kafka_backend) -> MainRun:
    return RUNS.record(request, "main_run", learner, kafka_backend)
