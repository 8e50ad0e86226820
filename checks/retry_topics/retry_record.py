"""Step 3 (retry-record): each callback whose first notify failed in consumer.py appears on callbacks.retry,
produced by consumer.py, with its key unchanged, the callback as its value (records.py: byte for byte with
headers, or a JSON envelope, or a flat merge), retryTimes 1 and nextRetryTime = the failed call's time + the
interval (epoch ms, within NEXT_TIME_TOLERANCE of virtual time). The upper bound also allows the virtual
seconds the retry consumer's sleeps moved the shared clock between the failure and the Produce: consumer.py
may have taken its time after them, and a correct consumer must not fail because the other slept."""
from __future__ import annotations

from retrylab.checks.retry_topics import lab, observe, records, timeline
from retrylab.checks.retry_topics.catalog import tr
from retrylab.fixtures.retry_topics.callbacks import key, label
from retrylab.verdict import fail

SECONDS_NOT_MS = 10 ** 11       # an epoch time below this (year 5138 in seconds) is seconds, not milliseconds


def first_retry_record(main_run, callback):
    """The first record carrying `callback` that consumer.py produced to callbacks.retry (None: none)."""
    own = [r for r in main_run.records(lab.RETRY_TOPIC) if r.callback is not None and r.callback == callback
           and r.produced is not None and r.produced.script == lab.MAIN_SCRIPT]
    return min(own, key=lambda r: r.produced.at) if own else None


def verify(main_run) -> None:
    observe.require_main(main_run)
    observe.require_state(main_run)
    failed = [(c, timeline.first_failure(main_run.calls_of(c, main_run.main))) for c in main_run.published]
    failed = [(c, f) for c, f in failed if f is not None]
    if not failed:
        fail(tr("step2.no_failure", script=lab.MAIN_SCRIPT, how=observe.how_it_ran(main_run.main)))
    for callback, failure in failed:
        record = first_retry_record(main_run, callback)
        if record is None:
            fail(missing(main_run, callback))
        if record.key != key(callback):
            fail(tr("step3.key", id=label(callback), where=record.where, got=records.shown(record.key),
                    expected=key(callback).decode()))
        check_retry_times(callback, record)
        check_next_time(main_run, callback, failure, record)


def check_retry_times(callback, record) -> None:
    raw = record.fields.get(lab.RETRY_TIMES)
    got = records.shown("-" if raw is None else raw)
    facts = dict(id=label(callback), where=record.where, name=lab.RETRY_TIMES, got=got)
    if raw is not None and record.retry_times is None:    # there, but "--1", "²", NaN...: say so, not "not 1"
        fail(tr("step3.retry_times_not_number", **facts))
    if record.retry_times != 1:
        fail(tr("step3.retry_times", **facts))


def missing(main_run, callback) -> str:
    on_topic = main_run.records(lab.RETRY_TOPIC)
    strangers = [r for r in on_topic if r.callback is None]
    if strangers:
        return tr("step3.unrecognised", id=label(callback), topic=lab.RETRY_TOPIC, where=strangers[0].where,
                  value=records.shown(strangers[0].record.value))
    return tr("step3.not_found", id=label(callback), topic=lab.RETRY_TOPIC, count=len(on_topic),
              how=observe.how_it_ran(main_run.main))


def check_next_time(main_run, callback, failure, record) -> None:
    raw = record.fields.get(lab.NEXT_RETRY_TIME)
    if raw is None:
        fail(tr("step3.no_next_time", id=label(callback), where=record.where, name=lab.NEXT_RETRY_TIME, got="-"))
    expected = failure.t + lab.INTERVAL
    value = record.next_retry_time
    due = record.due
    if due is None:     # not a number, or one no clock reaches (the right time with 400 zeros after it)
        fail(tr("step3.next_time_implausible", id=label(callback), where=record.where, name=lab.NEXT_RETRY_TIME,
                got=records.shown(raw), expected=int(expected * 1000)))
    others = main_run.retry_clock.advanced_between(timeline.real_time(failure), record.produced.at)
    low, high = expected - lab.NEXT_TIME_TOLERANCE, expected + lab.NEXT_TIME_TOLERANCE + others
    if not low <= due <= high:
        seconds = value < SECONDS_NOT_MS
        fail(tr("step3.next_time_seconds" if seconds else "step3.next_time", id=label(callback), where=record.where,
                name=lab.NEXT_RETRY_TIME, got=value, expected=int(expected * 1000),
                difference=f"{due - failure.t:+.0f}", interval=lab.RETRY_INTERVAL_MS,
                tolerance=f"{lab.NEXT_TIME_TOLERANCE:g}"))
