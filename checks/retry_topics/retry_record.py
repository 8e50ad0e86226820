"""Step 3 (retry-record): each callback whose first notify failed in consumer.py appears on callbacks.retry,
produced by consumer.py, with its key unchanged, the callback as its value (records.py: byte for byte with
headers, or a JSON envelope, or a flat merge), retryTimes 1 and nextRetryTime = the failed call's time + the
interval (epoch ms, within NEXT_TIME_TOLERANCE of virtual time). The upper bound also allows the virtual
seconds the OTHER script's sleeps moved the shared clock between the failure and the Produce (consumer.py may
have taken its time after the retry consumer's), and some of the script's own: a liveness thread or task, or the
client's own heartbeat routine (aiokafka's), moves the clock by its period every millisecond or so of real time,
and a beat that lands between the failed notify and the loop's time read makes the due time late by a whole
period (+5 s with asyncio.to_thread and a 5 s heartbeat, +300 s with a 300 s one; correct designs). The clock does
not say which thread or task slept, so the script's own moves count up to OWN_MOVES in all (a heartbeat of a
minute or less, jittered or drift-corrected too), or as one beat of a size it moved the clock by at least
BEAT_REPEATS times in the run (a longer fixed heartbeat), whichever is more. A wait of the loop itself after the
failure, one long sleep or a polling loop of short ones, makes a retry late by more than that and fails.

A record retry_consumer.py hands back to callbacks.retry after a failed retry is a retry record too (LAB.md:
retryTimes is 1 and 2 on the retry topic): its retryTimes is the failed attempts so far and its nextRetryTime
that failure's time + the interval, with the clock moves allowed as above. Without this a pair
that kept its real count and due time in headers of its own passed with the lab's fields left as read (1, and a
time already past), which a consumer of the topic trusting them retries at once. A copy of an earlier record of
the callback put back unchanged, with no failed attempt since that one (a "not due yet" requeue), is that record
again, not a new one. What retry_consumer.py hands back must keep the key and carry the callback as LAB.md's
forms do (a value no other consumer of the topic can read passed before, unjudged; a bare tombstone, no value and
no header, is a marker, not a retry), and neither script may produce retry records
with acks=0: the broker answers nothing, so such a record could be lost after its source was committed, and the
harness, which knows who wrote a record from the broker's answers, could judge none of them."""
from __future__ import annotations

import collections

from retrylab.checks.retry_topics import lab, observe, records, timeline
from retrylab.checks.retry_topics.catalog import tr
from retrylab.fixtures.retry_topics.callbacks import key, label
from retrylab.verdict import fail

SECONDS_NOT_MS = 10 ** 11       # an epoch time below this (year 5138 in seconds) is seconds, not milliseconds
OWN_MOVES = 60.0                # virtual seconds of a script's own clock moves a due time may be late by
BEAT_REPEATS = 20               # a clock move of one size made this often in a run is a heartbeat's beat (a run
                                # has fewer than 10 retries; a heartbeat beats hundreds of times a second)


def first_retry_record(on_topic, callback):
    """The first record carrying `callback` that consumer.py produced to callbacks.retry (None: none)."""
    own = [r for r in on_topic if r.callback is not None and r.callback == callback
           and r.produced is not None and r.produced.script == lab.MAIN_SCRIPT]
    return min(own, key=lambda r: r.produced.at) if own else None


def verify(main_run) -> None:
    observe.require_main(main_run)
    observe.require_state(main_run)
    unacknowledged = _produced_with_acks_0(main_run)
    if unacknowledged:
        fail(tr("step3.acks_zero", script=unacknowledged, topic=lab.RETRY_TOPIC))
    failed = [(c, timeline.first_failure(main_run.calls_of(c, main_run.main))) for c in main_run.published]
    failed = [(c, f) for c, f in failed if f is not None]
    if not failed:
        fail(tr("step2.no_failure", script=lab.MAIN_SCRIPT, how=observe.how_it_ran(main_run.main)))
    on_topic = main_run.records(lab.RETRY_TOPIC)      # read and recognised once for the step
    for callback, failure in failed:
        record = first_retry_record(on_topic, callback)
        if record is None:
            fail(missing(main_run, callback))
        if record.key != key(callback):
            fail(tr("step3.key", id=label(callback), where=record.where, got=records.shown(record.key),
                    expected=key(callback).decode()))
        check_retry_times(callback, record)
        check_next_time(main_run, callback, failure, record)
    for record in on_topic:
        if record.produced is None or record.produced.script != lab.RETRY_SCRIPT:
            continue
        if record.callback is None:
            if record.record.value is not None or record.fields:    # a bare tombstone is a marker, not a retry
                fail(tr("step3.later_unrecognised", script=lab.RETRY_SCRIPT, topic=lab.RETRY_TOPIC,
                        where=record.where, value=records.shown(record.record.value)))
            continue
        check_handed_back(main_run, record, on_topic)


def _produced_with_acks_0(main_run) -> str | None:
    """The script that produced to callbacks.retry with acks=0, if one did."""
    for script, run in ((lab.MAIN_SCRIPT, main_run.main), (lab.RETRY_SCRIPT, main_run.retry)):
        for request in (run.commands if run is not None else ()):
            if request.acks == 0 and any(b.topic == lab.RETRY_TOPIC for b in request.produced):
                return script
    return None


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
    """nextRetryTime = the failure's time + the interval, for consumer.py's record or one retry_consumer.py handed
    back (its own messages)."""
    raw = record.fields.get(lab.NEXT_RETRY_TIME)
    later = record.produced is not None and record.produced.script == lab.RETRY_SCRIPT
    prefix = "step3.later_" if later else "step3."
    if raw is None:
        fail(tr(prefix + "no_next_time", id=label(callback), where=record.where, name=lab.NEXT_RETRY_TIME, got="-"))
    expected = failure.t + lab.INTERVAL
    value = record.next_retry_time
    due = record.due
    if due is None:     # not a number, or one no clock reaches (the right time with 400 zeros after it)
        fail(tr(prefix + "next_time_implausible", id=label(callback), where=record.where, name=lab.NEXT_RETRY_TIME,
                got=records.shown(raw), expected=int(expected * 1000)))
    since = timeline.real_time(failure)
    own, other = ((main_run.retry_clock, main_run.main_clock) if later
                  else (main_run.main_clock, main_run.retry_clock))
    moved = other.advanced_between(since, record.produced.at) + _own_allowance(own, since, record.produced.at)
    low, high = expected - lab.NEXT_TIME_TOLERANCE, expected + lab.NEXT_TIME_TOLERANCE + moved
    if not low <= due <= high:
        seconds = value < SECONDS_NOT_MS
        stale = later and not seconds and due <= failure.t + lab.NEXT_TIME_TOLERANCE    # due when it was written
        kind = "next_time_seconds" if seconds else "next_time_stale" if stale else "next_time"
        fail(tr(prefix + kind, id=label(callback), where=record.where,
                name=lab.NEXT_RETRY_TIME, got=value, expected=int(expected * 1000),
                difference=f"{due - failure.t:+.0f}", interval=lab.RETRY_INTERVAL_MS,
                tolerance=f"{lab.NEXT_TIME_TOLERANCE:g}"))


def _own_allowance(view, start: float, end: float) -> float:
    """Virtual seconds of a run's own clock moves between two real times that a due time may be late by (module
    docstring): all of them up to OWN_MOVES, or the largest single beat of a heartbeat, whichever is more."""
    advances = view.advances
    sizes = collections.Counter(a.seconds for a in advances)
    inside = [a.seconds for a in advances if start <= a.at <= end]
    beat = max((s for s in inside if sizes[s] >= BEAT_REPEATS), default=0.0)
    return max(min(sum(inside), OWN_MOVES), beat)


def check_handed_back(main_run, record, on_topic) -> None:
    """A record retry_consumer.py produced to callbacks.retry: retryTimes = the failed attempts of its callback
    so far, nextRetryTime = the last one's time + the interval (the module's docstring)."""
    callback = record.callback
    failures = [c for c in main_run.calls_of(callback)
                if c.outcome == "error" and timeline.real_time(c) <= record.produced.at]
    if not failures or _requeued(record, on_topic, failures[-1]):
        return      # handed back before any failure: no attempt to count (steps 5 and 6 count the calls)
    if record.key != key(callback):
        fail(tr("step3.later_key", script=lab.RETRY_SCRIPT, id=label(callback), where=record.where,
                got=records.shown(record.key), expected=key(callback).decode()))
    raw = record.fields.get(lab.RETRY_TIMES)
    if record.retry_times != len(failures):
        fail(tr("step3.later_retry_times", id=label(callback), where=record.where, name=lab.RETRY_TIMES,
                got=records.shown("-" if raw is None else raw), expected=len(failures), script=lab.RETRY_SCRIPT))
    check_next_time(main_run, callback, failures[-1], record)


def _requeued(record, on_topic, last_failure) -> bool:
    """Is `record` an unchanged copy of an earlier record of its callback produced since its last failure?"""
    since = timeline.real_time(last_failure)
    return any(other.callback == record.callback and other.produced is not None
               and since <= other.produced.at < record.produced.at
               and other.retry_times is not None and other.retry_times == record.retry_times
               and other.next_retry_time is not None and other.next_retry_time == record.next_retry_time
               for other in on_topic)
