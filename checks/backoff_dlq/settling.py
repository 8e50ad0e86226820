"""When backoff-dlq's learner runs are stopped, composed from the engine's stop conditions
(retrylab.settle): judged from what the learner is doing, never from wall-clock quiet.

The worker runs (worker_run and advanced_run in runs.py) stop when the worker:
- waits in a blocking read with all its work done (BLPOP-forever workers, reliable queues);
- has done all its work and changes nothing while it gets DONE_IDLE_CPU of CPU (a worker that polls
  with sleep(1) when the queue is empty: virtual sleeps cost it about a millisecond each);
- waits in a blocking read without a timeout with its work not done (it dropped a message, say):
  nothing but another client could ever wake it;
- changes nothing while it gets STUCK_CPU of CPU from its first Redis command on (a loop that gets
  nowhere), or spins that long with no Redis command at all;
- called process more than RETRIES_FOREVER times for one message: it retries forever.
A worker that waits in a blocking read with a timeout while its work is not done (a retry due
later) is left to wait; RUN_TIMEOUT bounds it, with a message saying the harness stopped it.
Drain-and-exit workers and workers that really sleep between retries (virtual sleeps) just exit.

One-shot scripts (replay.py, alert.py) exit; ONE_SHOT stops one that waits without a timeout, waits
in a loop, or burns CPU without changing anything.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Callable, Iterable

from retrylab.brokers.redis import keyspace
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.checks.backoff_dlq import lab
from retrylab.settle import Reason, StopCondition, blocked, no_progress, repeated_read, when

RUN_TIMEOUT = 15.0          # outer bound, real seconds, of a worker run that does not finish
RETRIES_FOREVER = 25        # calls of process for one message that mean "never gives up"
STUCK_CPU = 2.0             # CPU seconds without any change: the worker will not get anywhere
DONE_IDLE_CPU = 0.3         # CPU seconds without any change once its work is done: it polls an empty queue
ONE_SHOT_CPU = 1.0          # CPU seconds a one-shot script may spend without changing anything

ONE_SHOT = blocked(forever=True) | repeated_read(3) | no_progress(cpu=ONE_SHOT_CPU)


def _most_called(progress) -> tuple[str, int]:
    counts = Counter(c.id for c in progress.calls())
    return counts.most_common(1)[0] if counts else ("", 0)


def _retries_forever(progress) -> bool:
    return _most_called(progress)[1] > RETRIES_FOREVER


def _retries_forever_detail(progress) -> str:
    message_id, calls = _most_called(progress)
    return tr("settle.retries_forever", calls=calls, id=message_id, limit=RETRIES_FOREVER)


def worker_settled(done: Callable[[object], bool], cancelled: threading.Event | None = None) -> StopCondition:
    """How a worker run ends, given `done(progress)`: the worker has done all its work."""
    condition = ((blocked() & when(done, Reason.BLOCKED_DONE))
                 | (no_progress(cpu=DONE_IDLE_CPU) & when(done, Reason.DONE_IDLE))
                 | blocked(forever=True)
                 | no_progress(cpu=STUCK_CPU)
                 | when(_retries_forever, Reason.CAP, _retries_forever_detail))
    if cancelled is not None:  # the grading ended first (interrupted, or a step's limit)
        condition = when(lambda progress: cancelled.is_set(), Reason.CANCELLED) | condition
    return condition


def lab_done(batch: Iterable[dict]) -> Callable[[object], bool]:
    """The lab run's work: every good message processed, q:tasks gone, the bad one in the DLQ."""
    batch = list(batch)
    goods = [m["id"] for m in batch if m["kind"] == "good"]
    bad = next(m["id"] for m in batch if m["kind"] == "bad").encode()

    def done(progress) -> bool:
        ok = {c.id for c in progress.calls() if c.outcome == "ok"}
        if not all(g in ok for g in goods):
            return False
        content = progress.snapshot()
        dlq = content.get(lab.DLQ.encode())
        return (lab.QUEUE.encode() not in content and dlq is not None
                and any(bad in v for v in dlq.values))

    return done


def every_message_accounted(batch: Iterable[dict]) -> Callable[[object], bool]:
    """The advanced run's work: q:tasks gone and every message processed, dead-lettered, or dropped
    (taken and no longer anywhere in Redis: the checks say what is wrong with that)."""
    ids = [m["id"] for m in batch]

    def done(progress) -> bool:
        content = progress.snapshot()
        if lab.QUEUE.encode() in content:
            return False
        calls = progress.calls()
        ok = {c.id for c in calls if c.outcome == "ok"}
        counts = Counter(c.id for c in calls)
        dlq = content.get(lab.DLQ.encode())

        def accounted(message_id: str) -> bool:
            needle = message_id.encode()
            if message_id in ok or (dlq is not None and any(needle in v for v in dlq.values)):
                return True
            return counts[message_id] > 0 and not keyspace.mentions(content, needle)

        return all(accounted(i) for i in ids)

    return done
