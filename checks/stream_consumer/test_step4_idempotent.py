"""Step 4: after the process ends between an effect and its XACK, the entry is still pending, is redelivered
after the restart, is not applied again, and is XACKed; no other order is lost or applied twice."""
import pytest

from retrylab import runreport
from retrylab.checks.stream_consumer import lab, observe, streams
from retrylab.checks.stream_consumer.catalog import tr
from retrylab.checks.stream_consumer.run_crash import CrashRun, acks, reads_noack, sent_after_the_end, takes_back
from retrylab.fixtures.stream_consumer.effects import ENDED_STATUS
from retrylab.verdict import fail

pytestmark = pytest.mark.step(4)


def _first_run_ended_at_target(crash: CrashRun) -> None:
    first = crash.first
    if observe.effects(first)[crash.target_id] == 0:
        fail(tr("step4.target_not_applied", id=crash.target_id, how=runreport.how_it_ran(first)))
    if not crash.ended_at_target():
        if first.result.stopped is not None:
            fail(tr("step4.went_on", id=crash.target_id, status=ENDED_STATUS))
        fail(tr("step4.did_not_end", id=crash.target_id, status=ENDED_STATUS, how=runreport.how_it_ran(first)))


def _nothing_after_the_end(crash: CrashRun) -> None:
    late = sent_after_the_end(crash)
    if late is not None:
        fail(tr("step4.acted_after_end", id=crash.target_id, command=late.name,
                ms=round((late.at - crash.effect_time()) * 1000)))


def _target_left_pending(crash: CrashRun) -> streams.Pending:
    pending = crash.target_pending(crash.after_crash)
    if pending is not None:
        return pending
    entry, effect_at = streams.text(crash.target_entry), crash.effect_time()
    if any(acks(c, crash.target_entry) and c.at <= effect_at for c in crash.first.commands):
        fail(tr("step4.acked_before_effect", id=crash.target_id, entry=entry))
    if any(reads_noack(c) for c in crash.first.commands):
        fail(tr("step4.noack", id=crash.target_id, entry=entry))
    fail(tr("step4.not_pending", id=crash.target_id, entry=entry, group=lab.GROUP))


def test_a_redelivery_after_a_crash_does_not_apply_twice(crash_run: CrashRun, request):
    crash = crash_run
    runreport.attach_runs(request.node, *crash.runs)
    observe.require_script(crash.first, "consumer.py")
    for run in crash.runs:
        observe.require_honest_calls(run, crash.seeded)
    _first_run_ended_at_target(crash)
    _nothing_after_the_end(crash)
    crashed = _target_left_pending(crash)

    second, target, entry = crash.second, crash.target_id, streams.text(crash.target_entry)
    effects = crash.effects()
    how = runreport.how_it_ran(second)
    if effects[target] > 1:
        fail(tr("step4.applied_twice", id=target, count=effects[target]))
    still = crash.target_pending(crash.at_end)
    redelivered = (any(takes_back(c, crash.target_entry, crashed.consumer) for c in second.commands)
                   or (still is not None and still.deliveries > crashed.deliveries))
    if not redelivered:
        fail(tr("step4.not_redelivered", id=target, entry=entry, how=how))
    if still is not None:
        fail(tr("step4.still_pending", id=target, entry=entry, deliveries=still.deliveries))

    others = [o["order_id"] for o in crash.seeded if o["order_id"] != target]
    lost = [o for o in others if effects[o] == 0]
    handed = next((o for o, i in zip(crash.seeded, crash.seeded_ids) if i == crash.handed), None)
    if handed is not None and handed["order_id"] in lost:
        fail(tr("step4.handed_lost", id=handed["order_id"], entry=streams.text(crash.handed),
                consumer=streams.text(crashed.consumer)))
    if lost:
        fail(tr("step4.others_lost", missing=len(lost), total=len(others), id=lost[0], how=how))
    twice = [o for o in others if effects[o] > 1]
    if twice:
        fail(tr("step4.others_twice", id=twice[0], count=effects[twice[0]]))
    if crash.at_end:
        fail(tr("step4.pending_at_end", count=len(crash.at_end), group=lab.GROUP, how=how))
    if crash.group is not None and crash.group.undelivered:
        fail(tr("step4.undelivered", count=crash.group.undelivered, group=lab.GROUP, how=how))
