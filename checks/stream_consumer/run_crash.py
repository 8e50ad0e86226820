"""Step 4's runs: consumer.py ended right after one order's effect, then started again (a restart).

On a private Redis with group `workers` created at id 0 by the harness, a few `ok` orders are added; one
of them (not the first: some work is done before the crash, some is left to the restart) is the target.
The first run's EffectsApp ends the learner's process right after the target's effect is applied, before
its XACK (the stub exits with status 86). The harness then notes what a crash leaves behind: is the target
still pending, with which delivery count, which effects were applied.

If entries are still undelivered then (a consumer reading one at a time), the harness reads the next one as
the ended consumer (its name, from the pending list): a crashed process may have had entries in hand that
it never applied, and a restart that acknowledges whatever was left pending, as if all of it had been
applied, must lose one here. The second run is consumer.py again, a new process (its own sandbox copy and
/tmp: only what is in Redis survives), until every order is applied and nothing is pending or undelivered
(held DONE_GRACE), or RESTART_WAIT s after its first command.

Both runs share one EffectsApp, so `end_after` acts once (the restarted consumer is left alone) and an
order's calls are counted across the restart; each run keeps its own call log (ScriptRun.calls), summed
by `effects()`. There is no second run when the first did not leave the target pending after its effect:
nothing to restart from, and the check fails on the first run alone.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import pytest
import redis

from retrylab.appchannel import RunClock
from retrylab.checks.stream_consumer.runs import RUNS
from retrylab.checks.stream_consumer import lab, observe, redelivery, streams
from retrylab.checks.stream_consumer.catalog import tr
from retrylab.checks.stream_consumer.settling import RUN_TIMEOUT, consumer_settled
from retrylab.fixtures.stream_consumer import orders
from retrylab.fixtures.stream_consumer.effects import ENDED_STATUS
from retrylab.fixtures.stream_consumer.effects_app import EffectsApp
from retrylab.runner import ScriptRun
from retrylab.settle import Reason, when

ORDERS = 4
TARGET = 1              # index of the order whose effect ends the first run: one before it, two after
FIRST_TIMEOUT = 5.0     # real seconds: the reference ends at the target well within 1 s
RESTART_WAIT = 2.5      # real seconds after the restarted consumer's first command for all its work to be done


@dataclass(frozen=True)
class CrashRun:
    seeded: tuple[dict, ...]
    target: dict                                # the order whose effect ended the first run
    seeded_ids: tuple[bytes, ...]               # each order's entry id in `orders`
    first: ScriptRun
    after_crash: tuple[streams.Pending, ...]    # the pending list once the first run ended
    handed: bytes | None                        # an entry the harness then read as the ended consumer
    second: ScriptRun | None                    # None: the first run left nothing to restart from
    at_end: tuple[streams.Pending, ...]         # the pending list once the second run ended
    group: streams.GroupState | None            # the group at the end

    @property
    def target_entry(self) -> bytes:
        return self.seeded_ids[TARGET]

    @property
    def target_id(self) -> str:
        return self.target["order_id"]

    @property
    def runs(self) -> tuple[ScriptRun, ...]:
        return (self.first,) if self.second is None else (self.first, self.second)

    def target_pending(self, pending: tuple[streams.Pending, ...]) -> streams.Pending | None:
        return next((p for p in pending if p.id == self.target_entry), None)

    def effects(self) -> Counter:
        """Effects applied per order id across both runs."""
        total = Counter()
        for run in self.runs:
            total += observe.effects(run)
        return total

    def ended_at_target(self) -> bool:
        """The first run applied the target's effect and ended as the harness ended it."""
        result = self.first.result
        return (observe.effects(self.first)[self.target_id] >= 1 and result is not None
                and result.stopped is None and result.returncode == ENDED_STATUS)

    def effect_time(self) -> float | None:
        """When the target's effect was applied in the first run (real epoch seconds, as commands' `at`)."""
        applied = [c.t for c in observe.calls_for(self.first, self.target_id) if c.outcome == "ok"]
        return applied[0] if applied else None


# -- what commands say --------------------------------------------------------------------------

def takes_back(command, entry: bytes, owner: bytes) -> bool:
    """A command that redelivers `entry`, pending with consumer `owner`: XCLAIM naming it, XAUTOCLAIM (its reply
    says which entries, the command does not), or XREADGROUP of `owner`'s own pending list (an id other than `>`:
    a consumer with a fixed name, restarted), on the lab's stream."""
    return redelivery.gives_back(command, entry, reader=owner)


def reads_noack(command) -> bool:
    return command.name == "XREADGROUP" and b"NOACK" in (a.upper() for a in command.args[4:])


def names(command, *values: bytes) -> bool:
    """Whether any argument contains one of `values` (an entry id, an order id, in a key or a field)."""
    return any(v and v in arg for arg in command.args[1:] for v in values)


def acks(command, entry: bytes) -> bool:
    return command.name == "XACK" and entry in command.args[3:]


def sent_after_the_end(crash: CrashRun):
    """The first command the first run sent after the target's effect ended it, that a crashed process could
    not have sent (None: none). A command sent then means the end was intercepted (an os._exit replaced to
    acknowledge or mark the entry first). What counts:
    - a command naming the target (its entry id or order id);
    - when the consumer used a single connection until then (it was blocked in effects.apply: nothing else
      could send), a command new to it: not one it had sent before on the same key. Another thread's
      routine (a heartbeat, a poll) may send in that instant, and repeats what it did before; and with
      more connections, another thread's work on other entries may be on its way just then."""
    effect_at, commands = crash.effect_time(), crash.first.commands
    if effect_at is None:
        return None
    before = [c for c in commands if c.at <= effect_at]
    single = len({c.conn for c in before}) <= 1
    routine = {(c.name, c.args[1:2]) for c in before}
    return next((c for c in commands if c.at > effect_at
                 and (names(c, crash.target_entry, crash.target_id.encode())
                      or (single and (c.name, c.args[1:2]) not in routine))), None)


# -- the runs -----------------------------------------------------------------------------------

def _applied(progress, order_id: str) -> bool:
    return any(c.id == order_id and c.outcome == "ok" for c in progress.calls())


def _first_done(target_id: str):
    """The first run has nothing more to show: the target was applied (the process should have ended at
    once) and the process is not ready to run (one that is may be ending, starved of CPU on a busy machine:
    it is not going on), or the group has nothing left for it to do."""
    def done(progress) -> bool:
        if _applied(progress, target_id):
            return not progress.running()
        state = streams.group(progress.link.client)
        return state is not None and state.pending == 0 and state.undelivered == 0
    return done


def _second_done(seeded: list[dict], before: Counter):
    ids = {o["order_id"] for o in seeded}

    def done(progress) -> bool:
        applied = {i for i, n in before.items() if n} | {c.id for c in progress.calls() if c.outcome == "ok"}
        if not ids <= applied:
            return False
        state = streams.group(progress.link.client)
        return state is not None and state.pending == 0 and state.undelivered == 0
    return done


def _given_up(target_id: str, seconds: float):
    """Stop a restarted consumer that has not finished `seconds` after its first command (it never takes
    the ended process's entries back, or never acknowledges them): waiting longer shows nothing more."""
    since: list[float | None] = [None]

    def late(progress) -> bool:
        if not progress.started():
            return False
        if since[0] is None:
            since[0] = time.monotonic()
        return time.monotonic() - since[0] >= seconds

    return when(late, Reason.CAP, lambda progress: tr("step4.gave_up", seconds=seconds, id=target_id))


def _hand_one_more(client, consumer: bytes) -> bytes | None:
    """Deliver the next undelivered entry, if any, to the ended `consumer`: an entry it had in hand, unapplied."""
    try:
        read = client.xreadgroup(lab.GROUP, consumer, {lab.STREAM: ">"}, count=1)
    except redis.ResponseError:     # the learner's first run removed the group or the stream: nothing to hand
        return None
    entries = read[0][1] if read else []
    return entries[0][0] if entries else None


@RUNS.observer("crash_run")
def observe_crash(learner, redis_backend, cancelled=None) -> CrashRun:
    batch = orders.batch(*["ok"] * ORDERS)
    target = batch[TARGET]
    app = EffectsApp(seeded=batch, end_after={target["order_id"]})
    with redis_backend.private() as endpoint, endpoint.client() as client:
        streams.create_group(client)
        ids = streams.seed(client, batch)
        first = learner.run("consumer.py", endpoint, timeout=FIRST_TIMEOUT, app=app, run_clock=RunClock.real(),
                            stop_when=consumer_settled(_first_done(target["order_id"]), cancelled))
        after_crash = tuple(streams.pending(client))
        record = CrashRun(seeded=tuple(batch), target=target, seeded_ids=tuple(ids), first=first,
                          after_crash=after_crash, handed=None, second=None, at_end=after_crash,
                          group=streams.group(client))
        if not record.ended_at_target() or record.target_pending(after_crash) is None:
            return record   # (when `cancelled` is set, the second run is stopped at once, and says so)
        handed = _hand_one_more(client, record.target_pending(after_crash).consumer)
        stop = consumer_settled(_second_done(batch, observe.effects(first)), cancelled) \
            | _given_up(target["order_id"], RESTART_WAIT)
        second = learner.run("consumer.py", endpoint, timeout=RUN_TIMEOUT, app=app, run_clock=RunClock.real(),
                             stop_when=stop)
        return CrashRun(seeded=tuple(batch), target=target, seeded_ids=tuple(ids), first=first,
                        after_crash=after_crash, handed=handed, second=second,
                        at_end=tuple(streams.pending(client)),
                        group=streams.group(client))


@pytest.fixture(scope="session")
def crash_run(request, learner, redis_backend):
    return RUNS.record(request, "crash_run", learner, redis_backend)
