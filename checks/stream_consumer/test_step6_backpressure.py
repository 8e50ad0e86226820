"""Step 6: producer.py --count N --max-lag M names its backpressure policy, keeps the lag near M, and
accounts for every order: each one is either in `orders` and applied once, or refused with a reason in
`orders:refused`; and it refuses only while the lag is at its limit."""
from collections import Counter

import pytest

from retrylab import runreport
from retrylab.checks.stream_consumer import lab, observe, refusals
from retrylab.checks.stream_consumer.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.step(6)

NEAR_WINDOW = 0.35      # seconds: a refusal is judged by the harness's lag samples this close to it
RAMP_SAMPLES = 3        # samples at the limit without a single refusal: a shed/reject producer waited


def lag_limit(max_lag: int) -> float:
    """The highest lag a producer's policy may let through: its limit, and a little for its own reads' age."""
    return max(max_lag + 5, 1.2 * max_lag)


def near_limit(max_lag: int) -> float:
    """A refusal is due when the lag is at least this (its limit, less what a read's age can hide)."""
    return max_lag - max(5, 0.2 * max_lag)


def lag_near(samples, at: float) -> int:
    """The higher of the harness's samples just before and just after `at` (each within NEAR_WINDOW);
    the nearest sample at all when the sampler had none that close."""
    before = [s for s in samples if at - NEAR_WINDOW <= s.t <= at]
    after = [s for s in samples if at <= s.t <= at + NEAR_WINDOW]
    near = [b for b in (before[-1:] + after[:1])]
    if not near:
        near = sorted(samples, key=lambda s: abs(s.t - at))[:1]
    return max((s.lag for s in near), default=0)


def _policy(run) -> str:
    lines = refusals.policy_lines(run.result.stdout)
    if not lines:
        fail(tr("step6.no_policy", policies=", ".join(f"policy={p}" for p in lab.POLICIES)))
    if len(lines) > 1:
        fail(tr("step6.several_policies", count=len(lines), seen=", ".join(f"policy={p}" for p in lines[:5])))
    if lines[0] not in lab.POLICIES:
        fail(tr("step6.unknown_policy", seen=lines[0], policies=", ".join(lab.POLICIES)))
    return lines[0]


def _producer_finished(run, bp) -> None:
    result = run.result
    if bp.producer_stopped == "idle":   # it waited on while the group had nothing left: its lag never falls
        fail(tr("step6.producer_waits_on", how=runreport.how_it_ran(run), count=bp.count, max_lag=bp.max_lag))
    if result.stopped:
        fail(tr("step6.producer_hung", how=runreport.how_it_ran(run), count=bp.count, max_lag=bp.max_lag))
    if result.returncode != 0:
        fail(tr("step6.producer_failed", how=runreport.how_it_ran(run), count=bp.count, max_lag=bp.max_lag))


def _nothing_lost(bp) -> None:
    if bp.trims:
        fail(tr("step6.trimmed", command=bp.trims[0], stream=lab.STREAM))
    if bp.entries_added > bp.count:
        fail(tr("step6.added_too_many", added=bp.entries_added, count=bp.count, stream=lab.STREAM))
    gone = bp.entries_added - bp.stream_length
    if gone > 0:
        fail(tr("step6.deleted", count=gone, added=bp.entries_added, stream=lab.STREAM))


def _lag_kept(bp) -> None:
    peak = max(bp.samples, key=lambda s: s.lag, default=None)
    limit = lag_limit(bp.max_lag)
    if peak is not None and peak.lag > limit:
        started = bp.producer_window[0]
        fail(tr("step6.lag_exceeded", peak=peak.lag, limit=f"{limit:g}", max_lag=bp.max_lag,
                seconds=f"{max(0.0, peak.t - started):.2f}"))


def _each_applied_once(bp) -> set[str]:
    ids = [e.get("order_id") for e in bp.entries]
    if any(not i for i in ids):
        entry = bp.entries[ids.index(next(i for i in ids if not i))]
        fail(tr("step6.entry_without_id", stream=lab.STREAM, id=entry.id.decode(), fields=refusals.shown_entry(entry)))
    repeated = [(i, n) for i, n in Counter(ids).items() if n > 1]
    if repeated:
        fail(tr("step6.duplicate_entry", id=repeated[0][0], count=repeated[0][1], stream=lab.STREAM))
    unapplied = [i for i in ids if bp.effects[i] == 0]
    if unapplied:
        fail(tr("step6.not_applied", missing=len(unapplied), total=len(ids), id=unapplied[0],
                how=runreport.how_it_ran(bp.consumer)))
    twice = [i for i in ids if bp.effects[i] > 1]
    if twice:
        fail(tr("step6.applied_twice", id=twice[0], count=bp.effects[twice[0]]))
    return set(ids)


def _refusals_recorded(bp) -> set[str]:
    if bp.refused_type:
        fail(tr("step6.refused_type", key=lab.REFUSED, type=bp.refused_type))
    for timed in bp.refusals:
        refusal = timed.refusal
        if not refusal.order_id or not (refusal.reason or "").strip():
            fail(tr("step6.refusal_incomplete", key=lab.REFUSED, record=refusal.shown))
    return {t.refusal.order_id for t in bp.refusals}


def _accounted(bp, added: set[str], refused: set[str]) -> None:
    both = added & refused
    if both:
        fail(tr("step6.added_and_refused", id=sorted(both)[0], count=len(both), key=lab.REFUSED))
    total = len(added) + len(refused)
    if total < bp.count:
        fail(tr("step6.lost", missing=bp.count - total, count=bp.count, added=len(added), refused=len(refused),
                key=lab.REFUSED))
    if total > bp.count:
        fail(tr("step6.too_many", total=total, count=bp.count, added=len(added), refused=len(refused)))


def _refused_only_under_pressure(bp, policy: str) -> None:
    if len(bp.refusals) >= bp.count:
        fail(tr("step6.refuses_everything", count=bp.count, policy=policy))
    threshold = near_limit(bp.max_lag)
    for timed in sorted(bp.refusals, key=lambda t: t.at or 0.0):
        if timed.at is None:
            fail(tr("step6.refusal_not_by_producer", id=timed.refusal.order_id, key=lab.REFUSED))
        seen = lag_near(bp.samples, timed.at)
        if seen < threshold:
            early = sum(1 for t in bp.refusals if t.at is not None and lag_near(bp.samples, t.at) < threshold)
            fail(tr("step6.refused_too_soon", id=timed.refusal.order_id, lag=seen, max_lag=bp.max_lag,
                    slack=f"{bp.max_lag - threshold:g}", count=early, total=len(bp.refusals), policy=policy))


def _did_what_it_said(bp, policy: str) -> None:
    if policy == "block":
        if bp.refusals:
            fail(tr("step6.block_refused", count=len(bp.refusals), key=lab.REFUSED))
        return
    if not bp.refusals:
        started, ended = bp.producer_window
        at_limit = [s for s in bp.samples if started <= s.t <= ended and s.lag >= bp.max_lag]
        if len(at_limit) >= RAMP_SAMPLES:
            fail(tr("step6.claims_but_waits", policy=policy, max_lag=bp.max_lag, key=lab.REFUSED))
        return
    _refused_only_under_pressure(bp, policy)


def test_producer_applies_its_policy_and_accounts_for_every_order(backpressure_run, request):
    bp = backpressure_run
    runreport.attach_runs(request.node, *(r for r in (bp.producer, bp.consumer) if r is not None))
    observe.require_script(bp.consumer, "consumer.py")
    if not bp.consumer_joined:
        fail(tr("step6.consumer_never_read", group=lab.GROUP, how=runreport.how_it_ran(bp.consumer)))
    observe.require_script(bp.producer, "producer.py")
    observe.require_honest_calls(bp.consumer, ())
    _producer_finished(bp.producer, bp)
    policy = _policy(bp.producer)
    _nothing_lost(bp)
    _lag_kept(bp)
    added = _each_applied_once(bp)
    refused = _refusals_recorded(bp)
    _accounted(bp, added, refused)
    _did_what_it_said(bp, policy)
