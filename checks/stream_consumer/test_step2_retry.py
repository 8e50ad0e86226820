"""Step 2: the flaky order (fails its first 2 deliveries) is reclaimed from the pending list with XAUTOCLAIM
or XCLAIM, after a wait of at least MIN_RETRY_GAP that grows from the first redelivery to the second,
and is then applied once.

Each redelivery's wait is bounded from both sides by the call log and the relay's record (redelivery.py): it
is immediate when even its longest bound is under MIN_RETRY_GAP; it grows when the min-idle of the claims that
gave the entry back grows (both >= MIN_RETRY_GAP, each agreeing with its observed wait), or when the second
gap between the calls is longer than the first's by MIN_RETRY_GAP at least (redelivery.waits_grow). A busy
machine never makes a correct consumer look immediate.

How long the consumer, and the harness thread that stamps its calls, waited for a CPU is known per call
(Call.cpu_wait, from the kernel), and how long it spent on other orders in each gap, or waiting for replies
later than a quiet server gives them, from the call log and the relay's record (Command.answered_at): the gaps
decide only if they would have decided the same way without either. When they would
not, the run is made again (a busy moment seldom hits twice at the same place), and if no run can tell, the
step is reported as not graded, saying why: a busy machine never decides step 2's verdict.
"""
import pytest

from retrylab import runreport
from retrylab.checks.stream_consumer import lab, observe, redelivery, streams
from retrylab.checks.stream_consumer.catalog import tr
from retrylab.checks.stream_consumer.run_retry import observe_retry
from retrylab.checks.stream_consumer.settling import RUN_TIMEOUT
from retrylab.verdict import cannot_judge, fail

pytestmark = pytest.mark.step(2)

RERUNS = 4              # runs made again when a busy machine may have decided whether the waits grow (time allowing)
RERUN_SLACK = 5.0       # seconds of the step's time limit kept beyond a run's own bound before one is made again


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _why_not_applied(retry, calls) -> None:
    """Fail with what became of a flaky order that was never applied."""
    run, flaky = retry.run, retry.flaky
    order_id, entry_id = flaky["order_id"], retry.entry_id(flaky)
    how = runreport.how_it_ran(run)
    if not calls:
        fail(tr("step2.never_called", id=order_id, how=how))
    acks = redelivery.acks(run.commands, entry_id)
    if acks and acks[0].at < calls[0].t:
        fail(tr("step2.acked_before_effect", id=order_id))
    if any(e.get("order_id") == order_id for e in retry.dlq):
        fail(tr("step2.dead_lettered", id=order_id, calls=len(calls), dlq=lab.DLQ, max=lab.MAX_DELIVERIES))
    pending = retry.pending_entry(flaky)
    if redelivery.skipped(calls, run.commands, entry_id, pending):
        fail(tr("step2.reclaimed_not_applied", id=order_id))
    if pending is None:
        fail(tr("step2.acked_after_failure", id=order_id, failures=len(calls)))
    fail(tr("step2.never_redelivered", id=order_id, failures=len(calls), stream=lab.STREAM, how=how))


def _judge(retry) -> bool:
    """Step 2 on one retry run: True if it passes, False if a busy machine may have decided whether its waits
    grow (redelivery.waits_grow); fails with what to fix otherwise."""
    run = retry.run
    observe.require_script(run, "consumer.py")
    observe.require_honest_calls(run, retry.seeded)
    flaky = retry.flaky
    order_id, entry_id = flaky["order_id"], retry.entry_id(flaky)
    calls = observe.calls_for(run, order_id)
    applied = observe.effects(run)[order_id]
    if applied == 0:
        _why_not_applied(retry, calls)
    if applied > 1:
        fail(tr("step2.applied_twice", id=order_id, count=applied))
    others = [o["order_id"] for o in retry.seeded if o["order_id"] != order_id and o["order_id"] in retry.ids]
    again = redelivery.redeliveries(calls, run.commands, entry_id, run.calls, redelivery.Orders(
        frozenset(o.encode() for o in others), frozenset(retry.ids[o] for o in others)))
    if len(again) < lab.FLAKY_FAILURES:   # calls from processes side by side, recorded out of order
        fail(tr("step2.never_redelivered", id=order_id, failures=len(calls) - 1, stream=lab.STREAM,
                how=runreport.how_it_ran(run)))
    for number, redelivered in enumerate(again, start=2):
        if redelivered.gap < lab.MIN_RETRY_GAP:
            fail(tr("step2.immediate", id=order_id, n=number, gap_ms=_ms(redelivered.gap),
                    min_ms=_ms(lab.MIN_RETRY_GAP)))
    if not redelivery.claims_between(run.commands, entry_id, calls[0].t, calls[-1].t):
        past = redelivery.autoclaims_past(run.commands, entry_id, calls[0].t, calls[-1].t)
        if past:    # XAUTOCLAIMs were sent, each from past the entry: none could take it
            fail(tr("step2.claim_past_entry", id=order_id, stream=lab.STREAM, entry=entry_id.decode(),
                    start=streams.text(past[0].args[5])))
        fail(tr("step2.no_claim", id=order_id, stream=lab.STREAM))
    first, second = again[0], again[1]
    grows = redelivery.waits_grow(first, second)
    if grows is not False:
        return bool(grows)
    for number, redelivered in enumerate(again[:2], start=2):
        if redelivered.min_idle_ms is not None and redelivery.claimed_with(redelivered) is None:
            fail(tr("step2.claim_not_taken", id=order_id, n=number, gap_ms=_ms(redelivered.gap),
                    idle_ms=redelivered.min_idle_ms))
    shown = [str(r.min_idle_ms) if r.min_idle_ms is not None else "?" for r in (first, second)]
    fail(tr("step2.not_growing", id=order_id, gap1_ms=_ms(first.gap), gap2_ms=_ms(second.gap),
            idle1=shown[0], idle2=shown[1], margin_ms=_ms(lab.MIN_RETRY_GAP)))


def _time_for_a_run(learner) -> bool:
    left = learner.clock.remaining() if learner.clock else None
    return left is None or left >= RUN_TIMEOUT + RERUN_SLACK


def test_flaky_entry_reclaimed_after_growing_waits_then_applied_once(retry_run, request, learner, redis_backend):
    retry, runs = retry_run, 1
    runreport.attach_runs(request.node, retry.run)
    while not _judge(retry):
        if runs > RERUNS or not _time_for_a_run(learner):
            cannot_judge(tr("step2.too_busy", runs=runs, margin_ms=_ms(lab.MIN_RETRY_GAP)))
        retry, runs = observe_retry(learner, redis_backend), runs + 1
        runreport.attach_runs(request.node, retry.run)
