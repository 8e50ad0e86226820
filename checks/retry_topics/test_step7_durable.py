"""Step 7: both consumers SIGKILLed in the middle of a retry, with other retries pending, then restarted
(run_durable.py): nothing is lost, nothing repeated, nothing retried early, and every record is handed on
(its retry or DLQ record stored) before its offset is committed."""
import pytest

from retrylab import runreport
from retrylab.checks.retry_topics import durability, lab, observe
from retrylab.checks.retry_topics.catalog import tr
from retrylab.checks.retry_topics.pair import START_LIMIT
from retrylab.checks.retry_topics.run_durable import HANG_WAIT
from retrylab.verdict import fail

pytestmark = pytest.mark.step(7)


def _require_the_kill(run) -> None:
    """The kill could be made only if the target's first retry came (and hung): say why it did not."""
    if run.killed_at is not None:
        return
    missing = run.missing
    if missing:
        fail(tr("observe.script_missing", script=missing))
    ended = [r for r in run.first.runs.values() if r.result.stopped is None]
    if ended:
        fail(tr("step7.ended_early", script=ended[0].result.script, how=observe.how_it_ran(ended[0])))
    if not all(run.first.fetching.values()):
        fail(tr("step7.never_read", seconds=START_LIMIT, group=lab.MAIN_GROUP, retry_group=lab.RETRY_GROUP))
    calls = durability.attempts(run).get(run.target, [])
    if not calls:
        fail(tr("step7.target_not_notified", id=run.target))
    observe.incomplete(run, tr("step7.no_retry", id=run.target, seconds=round(run.hang_waited or HANG_WAIT)))


def _diagnose_loss(run, lost: list[str]) -> str:
    """Why retries were lost, from what the first half did: the likeliest cause first."""
    calls = durability.attempts(run)
    in_memory = [o for o, cs in calls.items() if sum(1 for a in cs if a.script == lab.MAIN_SCRIPT) > 1]
    if in_memory:
        return tr("step7.why_in_memory", id=in_memory[0], script=lab.MAIN_SCRIPT)
    # dead-lettered, so not lost in the kill: the attempts were counted short
    gave_up = [o for o in lost if durability.retry_records(run.state, o, on=lab.DLQ_TOPIC)]
    if gave_up:
        return tr("step7.why_gave_up", id=gave_up[0], dlq=lab.DLQ_TOPIC, made=len(calls.get(gave_up[0], [])),
                  attempts=lab.MAX_ATTEMPTS)
    committed = run.first.committed(lab.RETRY_SCRIPT)
    pending = [r for o in lost for r in durability.retry_records(run.state, o)]
    uncommitted = sorted({r.partition for r in pending
                          if (lab.RETRY_GROUP, lab.RETRY_TOPIC, r.partition) not in committed})
    target_records = durability.retry_records(run.state, run.target)
    if run.target in lost and target_records and any(
            committed.get((lab.RETRY_GROUP, lab.RETRY_TOPIC, r.partition), -1) > r.offset for r in target_records[:1]):
        return tr("step7.why_committed_first", id=run.target, group=lab.RETRY_GROUP)
    if uncommitted:
        return tr("step7.why_latest", group=lab.RETRY_GROUP, topic=lab.RETRY_TOPIC,
                  partitions=", ".join(map(str, uncommitted)))
    return tr("step7.why_unknown", script=lab.RETRY_SCRIPT)


def test_a_kill_loses_and_repeats_nothing(durable_run, request):
    runreport.attach_runs(request.node, *(r for h in (durable_run.first, durable_run.second) if h is not None
                                   for r in h.runs.values()))
    judge(durable_run)


def judge(run) -> None:
    """Fail with what the kill lost or repeated, in the order a learner should fix it."""
    for half in (run.first, run.second):
        for script_run in (half.runs.values() if half is not None else ()):
            if not script_run.missing:
                observe.require_honest_calls(script_run)
    _require_the_kill(run)
    calls = durability.attempts(run)
    # a restarted consumer that ended by itself (crashed) is worth showing with a loss
    ended = [observe.how_it_ran(r) for r in run.second.runs.values()
             if r.result is not None and r.result.stopped is None]
    restarted = "\n" + tr("step7.after_restart", how="\n".join(ended)) if ended else ""

    # nothing that had succeeded is notified again (a group that never commits starts over)
    succeeded = [o for o, cs in calls.items()
                 if any(a.outcome == "ok" and not a.after_kill for a in cs) and any(a.after_kill for a in cs)]
    if succeeded:
        committed = run.first.committed(lab.MAIN_SCRIPT)
        fail(tr("step7.renotified", count=len(succeeded), id=succeeded[0], group=lab.MAIN_GROUP,
                commits=sum(1 for k in committed if k[0] == lab.MAIN_GROUP)))

    # the hung retry is made again, and every retry pending at the kill still happens
    short = [o for o in (c["orderId"] for c in run.published)
             if len(calls.get(o, [])) < durability.expected_calls(run, o)]
    if short:
        key = "step7.hung_lost" if run.target in short else "step7.pending_lost"
        order = run.target if run.target in short else short[0]
        observe.incomplete(run, tr(key, id=order, count=len(short), merchant=run.merchant(order),
                                   made=len(calls.get(order, [])), expected=durability.expected_calls(run, order),
                                   why=_diagnose_loss(run, short)) + restarted)

    # ... once each
    extra = [o for o in (c["orderId"] for c in run.published)
             if len(calls.get(o, [])) > durability.expected_calls(run, o)]
    if extra:
        order = extra[0]
        fail(tr("step7.repeated", id=order, merchant=run.merchant(order), made=len(calls[order]),
                expected=durability.expected_calls(run, order)))

    # ... and not before they are due
    early = durability.early_retries(run)
    if early:
        order, at, due = early[0]
        fail(tr("step7.early", id=order, seconds=f"{due - at:.0f}", field=lab.NEXT_RETRY_TIME))

    # every record handed on before its offset was committed: a kill in between would lose it
    handed_late = durability.commits_before_handing_on(run)
    if handed_late:
        first = handed_late[0]
        fail(tr("step7.commit_first", script=first.script, id=first.order, topic=first.topic,
                partition=first.partition, offset=first.offset, stored_to=first.stored_to,
                count=len(handed_late)))
