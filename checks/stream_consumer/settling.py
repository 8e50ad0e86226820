"""When stream-consumer's learner runs are stopped, composed from the engine's stop conditions
(retrylab.settle). These runs are on real time (RunClock.real: a min-idle time is the server's), so a
consumer that polls every 100 ms costs little CPU while it waits: "done" is judged from the broker's
state and the call log, and then held for DONE_GRACE real seconds, so an entry applied twice right
after the work looked done is still seen.

A run stops when:
- its work is done and stays done for DONE_GRACE seconds;
- it waits in a blocking read without a timeout with its work not done (nothing could wake it);
- it changes nothing while it gets STUCK_CPU of CPU (a loop that gets nowhere);
- it called effects.apply more than RETRIES_FOREVER times for one order: it retries forever;
- (with `ready`) nothing changed, neither the call log nor the keys' shape, for QUIET real seconds once
  `ready` said every order the harness added was called at least once: it waits for nothing that will come;
- `cancelled` is set (the grading is ending), or the run's own timeout passes;
- (with `slowed_down`, for runs whose work takes a quiet machine seconds) past a quiet machine's bound, the work
  left has not fallen for STALLED_QUIET real seconds: on a busy machine such a consumer drains slowly and runs on
  while it does, up to BUSY_FACTOR times that bound.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Callable

from retrylab.checks.stream_consumer.catalog import tr
from retrylab.settle import Reason, StopCondition, blocked, no_progress, when

RUN_TIMEOUT = 10.0          # outer bound, real seconds, of a consumer run
DONE_GRACE = 0.35           # real seconds the work must stay done before the run is stopped
RETRIES_FOREVER = 12        # calls of apply for one order that mean "never gives up"
STUCK_CPU = 2.0             # CPU seconds without any change: the consumer will not get anywhere
# Real seconds without any change, once every order was called at least once: a consumer that waits out
# min-idle times uses almost no CPU, so no_progress(cpu=) would take the whole RUN_TIMEOUT to see one that
# never XACKs or never dead-letters. The longest quiet a right consumer has is its longest min-idle wait
# (LAB.md: hundreds of ms; the hint says 200 then 400 ms; up to 1 s accepted) plus one poll period
# (a BLOCK of 100-500 ms) and scheduling on a busy machine: 1.0 + 0.5. Its clock only starts once every
# order was called at least once, so a slow interpreter start is never taken for quiet.
QUIET = 1.5
# The outer bounds of runs that wait for work a consumer drains at its pace: this many times a quiet machine's
# (4 gradings beside 2 CPU hogs on 2 cores, load average 23, took correct runs 4 times their quiet time).
BUSY_FACTOR = 3.0
STALLED_QUIET = 3.0         # real seconds without a change, past a quiet machine's bound: the consumer is not slow, it stalls


def _most_called(progress) -> tuple[str, int]:
    counts = Counter(c.id for c in progress.calls())
    return counts.most_common(1)[0] if counts else ("", 0)


def _retries_forever(progress) -> bool:
    return _most_called(progress)[1] > RETRIES_FOREVER


def _retries_forever_detail(progress) -> str:
    order_id, calls = _most_called(progress)
    return tr("settle.retries_forever", calls=calls, id=order_id, limit=RETRIES_FOREVER)


def held_for(done: Callable[[object], bool], seconds: float) -> Callable[[object], bool]:
    """`done`, once it has said yes at every look for `seconds` of real time."""
    since: list[float | None] = [None]

    def held(progress) -> bool:
        if not done(progress):
            since[0] = None
            return False
        if since[0] is None:
            since[0] = time.monotonic()
        return time.monotonic() - since[0] >= seconds

    return held


def quiet_for(ready: Callable[[object], bool], seconds: float) -> Callable[[object], bool]:
    """Nothing changed (the number of calls, each key's type and length) for `seconds` of real time,
    counted from the later of the last change and the first look at which `ready` said yes."""
    last: list = [None, 0.0]    # the signature at the last change, and when it was seen

    def quiet(progress) -> bool:
        if not ready(progress):
            last[0] = None
            return False
        signature = (len(progress.calls()), progress.link.shape())
        now = time.monotonic()
        if signature != last[0]:
            last[0], last[1] = signature, now
            return False
        return now - last[1] >= seconds

    return quiet


def slowed_down(backlog: Callable[[object], int | None], bound: float = RUN_TIMEOUT,
                quiet: float = STALLED_QUIET) -> StopCondition:
    """Past `bound` (a quiet machine's), a run goes on while `backlog(progress)` (the work left: a group's
    undelivered + pending, say) keeps falling to new lows; it is stopped once it has not for `quiet` real
    seconds. Nothing else the learner changes counts, so a consumer cannot keep its run going by touching other
    keys. Its own timeout is then `bound` * BUSY_FACTOR. The backlog is read only past `bound`."""
    first: list[float | None] = [None]
    low: list = [None, 0.0]      # the lowest backlog seen past the bound, and when it was reached

    def stalled(progress) -> bool:
        now = time.monotonic()
        if first[0] is None:
            first[0] = now
        if now - first[0] < bound:
            return False
        left = backlog(progress)
        if low[0] is None or (left is not None and left < low[0]):
            low[0], low[1] = (left if left is not None else float("inf")), now
        return now - low[1] >= quiet

    return when(stalled, Reason.CAP, lambda progress: tr("settle.stalled", seconds=f"{bound:g}", quiet=f"{quiet:g}"))


def _quiet_detail(_progress) -> str:
    return tr("settle.quiet", seconds=QUIET)


def consumer_settled(done: Callable[[object], bool], cancelled: threading.Event | None = None,
                     grace: float = DONE_GRACE, ready: Callable[[object], bool] | None = None,
                     quiet: float = QUIET) -> StopCondition:
    """How a consumer run ends, given `done(progress)`: the consumer has done all its work; `ready`:
    every order was called at least once (from then on QUIET real seconds without a change end the run)."""
    condition = (when(held_for(done, grace), Reason.DONE_WAITED, lambda progress: f"{grace:.2f}")
                 | blocked(forever=True)
                 | no_progress(cpu=STUCK_CPU)
                 | when(_retries_forever, Reason.CAP, _retries_forever_detail))
    if ready is not None:
        condition = condition | when(quiet_for(ready, quiet), Reason.CAP, _quiet_detail)
    if cancelled is not None:
        condition = when(lambda progress: cancelled.is_set(), Reason.CANCELLED) | condition
    return condition
