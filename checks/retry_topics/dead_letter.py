"""Step 6 (dlq): the down callback is notified exactly 3 times; then exactly one record carrying it is on
callbacks.dlq, produced after the 3rd call, with the original key, the callback as its value (records.py),
retryTimes 3, and the 3rd call's error text somewhere in its headers or envelope fields (as a substring:
"NotifyError: <text>" passes)."""
from __future__ import annotations

from retrylab.checks.retry_topics import lab, observe, records, timeline
from retrylab.checks.retry_topics.catalog import tr
from retrylab.fixtures.retry_topics.callbacks import key, label
from retrylab.verdict import fail


def verify(main_run) -> None:
    observe.require_pair(main_run)
    observe.require_state(main_run)
    down = main_run.scenario.down
    calls = main_run.calls_of(down)
    facts = dict(id=label(down), count=len(calls), expected=lab.MAX_ATTEMPTS)
    if len(calls) > lab.MAX_ATTEMPTS:
        fail(tr("step6.too_many", **facts))
    dead = [r for r in main_run.records(lab.DLQ_TOPIC) if r.callback == down]
    if len(calls) < lab.MAX_ATTEMPTS:
        observe.incomplete(main_run, tr("step6.too_few", **facts, how=observe.how_both_ran(main_run)))
    if not dead:
        strangers = [r for r in main_run.records(lab.DLQ_TOPIC) if r.callback is None]
        if strangers:
            fail(tr("step6.unrecognised", id=label(down), topic=lab.DLQ_TOPIC, where=strangers[0].where,
                    value=records.shown(strangers[0].record.value)))
        observe.incomplete(main_run, tr("step6.none", id=label(down), topic=lab.DLQ_TOPIC,
                                        how=observe.how_both_ran(main_run)))
    if len(dead) > 1:
        fail(tr("step6.several", id=label(down), topic=lab.DLQ_TOPIC, count=len(dead)))
    record = dead[0]
    if record.produced is not None and record.produced.at < timeline.real_time(calls[-1]):
        fail(tr("step6.before_last", id=label(down), topic=lab.DLQ_TOPIC, expected=lab.MAX_ATTEMPTS))
    if record.key != key(down):
        fail(tr("step6.key", id=label(down), where=record.where, got=records.shown(record.key),
                expected=key(down).decode()))
    raw = record.fields.get(lab.RETRY_TIMES)
    got = records.shown("-" if raw is None else raw)
    facts = dict(id=label(down), where=record.where, name=lab.RETRY_TIMES, got=got, expected=lab.MAX_ATTEMPTS)
    if raw is not None and record.retry_times is None:    # there, but "--1", "²", NaN...: say so, not "not 3"
        fail(tr("step6.retry_times_not_number", **facts))
    if record.retry_times != lab.MAX_ATTEMPTS:
        fail(tr("step6.retry_times", **facts))
    check_error(down, calls, record)


def check_error(down, calls, record) -> None:
    texts = record.texts()
    last = calls[-1].error or ""
    if any(last in text for text in texts):
        return
    earlier = next((n for n, c in enumerate(calls[:-1], 1) if c.error and any(c.error in t for t in texts)), None)
    if earlier is not None:
        fail(tr("step6.earlier_error", id=label(down), where=record.where, number=earlier, last=last))
    fail(tr("step6.no_error", id=label(down), where=record.where, last=last,
            fields=", ".join(sorted(record.fields)) or "-"))
