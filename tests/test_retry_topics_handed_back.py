"""retry-topics step 3 on the records retry_consumer.py hands back to callbacks.retry after a failed retry:
retryTimes = the failed attempts so far, nextRetryTime = that failure's time + the interval. A pair that kept
its real count and due time in headers of its own, and left the lab's fields as read, passed every step
(wrong/stale-fields-on-second-retry grades it end to end, tests/test_retry_topics_corpus.py)."""
from __future__ import annotations

import types

import pytest

from retrylab import i18n
from retrylab.brokers.kafka.state import KafkaRecord
from retrylab.checks.retry_topics import lab, records, retry_record
from retrylab.fixtures.retry_topics.callbacks import key, new_callback, payload
from retrylab.verdict import CheckFailed

START = 1_796_792_483.965           # a virtual clock's epoch seconds, as a grading sees one
LANGUAGES = ("en", "zh", "ru", "fa")


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))


def _record(callback, retry_times, next_time, offset: int, at: float, script=lab.RETRY_SCRIPT, **kafka):
    headers = tuple((k, v.encode()) for k, v in ((lab.RETRY_TIMES, retry_times), (lab.NEXT_RETRY_TIME, next_time))
                    if v is not None)
    fields = {"key": key(callback), "value": payload(callback), **kafka}
    found = records.recognise(KafkaRecord(lab.RETRY_TOPIC, 0, offset, fields["key"], fields["value"], headers, 0),
                              [callback])
    return records.LabRecord(found.record, found.callback, found.form, found.fields, records.Produced(script, at))


def _clock(moves: list[float], beat: float | None = None):
    """A run's ClockView whose moves (virtual seconds, each at every real time asked about) are `moves`; with
    `beat`, also a heartbeat's beats of that size all through the run (none of them at those times)."""
    advances = [types.SimpleNamespace(at=START + lab.INTERVAL + 0.005, seconds=s) for s in moves]
    advances += [types.SimpleNamespace(at=-1.0, seconds=beat) for _ in range(30 if beat else 0)]
    return types.SimpleNamespace(advances=tuple(advances), advanced_between=lambda start, end: sum(moves))


def _run(callback, failures: list[float], moved: float = 0.0, own: float = 0.0, beat: float | None = None):
    """A main run whose callback failed at these virtual times (the clock's offset 0: real time = virtual time);
    consumer.py's clock moves add up to `moved` virtual seconds at the second failure, retry_consumer.py's to `own`
    (one move; a heartbeat's beat when `beat` is its size)."""
    calls = [types.SimpleNamespace(t=t, offset=0.0, outcome="error", id=callback["orderId"]) for t in failures]
    return types.SimpleNamespace(calls_of=lambda c, run=None: calls, main_clock=_clock([moved] if moved else []),
                                 retry_clock=_clock([own] if own else [], beat=beat))


def _first_and_second(callback, retry_times="2", next_time=None, **kafka):
    """consumer.py's record of the first failure (at START) and retry_consumer.py's of the second (one interval
    later), with these fields."""
    second_failure = START + lab.INTERVAL
    first = _record(callback, "1", _ms(START + lab.INTERVAL), 0, START + 0.01, script=lab.MAIN_SCRIPT)
    handed_back = _record(callback, retry_times, next_time or _ms(second_failure + lab.INTERVAL), 1,
                          second_failure + 0.01, **kafka)
    return [first, handed_back], _run(callback, [START, second_failure])


def test_a_record_handed_back_with_the_right_fields_passes():
    callback = new_callback("down")
    on_topic, run = _first_and_second(callback)
    retry_record.check_handed_back(run, on_topic[1], on_topic)


@pytest.mark.parametrize("lang", LANGUAGES)
@pytest.mark.parametrize("retry_times", ["1", "3", "--1", None])
def test_a_record_handed_back_with_another_count_fails_naming_the_count(retry_times, lang):
    callback = new_callback("down")
    on_topic, run = _first_and_second(callback, retry_times=retry_times)
    with i18n.use(lang), pytest.raises(CheckFailed) as failed:
        retry_record.check_handed_back(run, on_topic[1], on_topic)
    message = failed.value.message
    assert lab.RETRY_SCRIPT in message and records.shown(retry_times or "-") in message and "2" in message
    if lang == "en":
        assert "after 2 failed attempts" in message


@pytest.mark.parametrize("lang", LANGUAGES)
def test_a_record_handed_back_with_the_due_time_it_read_fails(lang):
    # the attack: the nextRetryTime of the record before, an interval in the past when the record is made
    callback = new_callback("down")
    on_topic, run = _first_and_second(callback, next_time=_ms(START + lab.INTERVAL))
    with i18n.use(lang), pytest.raises(CheckFailed) as failed:
        retry_record.check_handed_back(run, on_topic[1], on_topic)
    assert _ms(START + 2 * lab.INTERVAL) in failed.value.message
    if lang == "en":
        assert "+0 s from the failed retry: it was due when it was written" in failed.value.message


@pytest.mark.parametrize("next_time, words", [
    ("NaN", "not a plausible epoch-milliseconds time"), (_ms(START + 2 * lab.INTERVAL)[:-3], "epoch seconds"),
    ("9" * 5000, "not a plausible epoch-milliseconds time")])
def test_a_record_handed_back_with_garbage_or_seconds_says_so(next_time, words):
    callback = new_callback("down")
    on_topic, run = _first_and_second(callback, next_time=next_time)
    with i18n.use("en"), pytest.raises(CheckFailed, match=words):
        retry_record.check_handed_back(run, on_topic[1], on_topic)


def test_the_clock_moves_between_the_failure_and_the_produce_are_allowed_for():
    callback = new_callback("down")
    late = _ms(START + lab.INTERVAL + lab.INTERVAL + 60)       # written 60 virtual seconds after the failure
    on_topic, run = _first_and_second(callback, next_time=late)
    with i18n.use("en"), pytest.raises(CheckFailed, match="not the interval") as failed:
        retry_record.check_handed_back(run, on_topic[1], on_topic)
    assert "already past" not in failed.value.message      # late is not stale
    failures = [START, START + lab.INTERVAL]
    retry_record.check_handed_back(_run(callback, failures, moved=60.0), on_topic[1], on_topic)
    # its own: a heartbeat task's asyncio.sleep(5) moved the clock while notify ran in a worker thread, before the
    # loop read the time (correct/aiokafka-retry-heartbeat-to-thread failed so: +605 s)
    beat = _ms(START + 2 * lab.INTERVAL + 5.004)
    on_topic, run = _first_and_second(callback, next_time=beat)
    with i18n.use("en"), pytest.raises(CheckFailed, match="not the interval"):
        retry_record.check_handed_back(run, on_topic[1], on_topic)
    retry_record.check_handed_back(_run(callback, failures, own=5.0), on_topic[1], on_topic)
    # the third review's: a 300 s heartbeat task, one beat between the failure and the time read (+300 s): more
    # than a minute of the script's own moves, but a beat of a size it moved the clock by all through the run
    on_topic, _ = _first_and_second(callback, next_time=_ms(START + 2 * lab.INTERVAL + 300.001))
    with i18n.use("en"), pytest.raises(CheckFailed, match="not the interval"):
        retry_record.check_handed_back(_run(callback, failures, own=300.0), on_topic[1], on_topic)
    retry_record.check_handed_back(_run(callback, failures, own=300.0, beat=300.0), on_topic[1], on_topic)


@pytest.mark.parametrize("moves, beat, late, passes", [
    ([1.0] * 600, 1.0, 600, False),         # the fourth review's: a polling wait of sleep(1) after the failure
    ([60.0] * 60, 60.0, 3600, False),       # ... of sleep(60)
    ([600.0], None, 600, False),            # one long sleep after the failure
    ([2.998, 2.997], None, 6, True),        # aiokafka's own heartbeat routine, two beats of varying size
    ([20.0], None, 20, True),               # ... with heartbeat_interval_ms=20000
    ([29.999], None, 30, True),             # a drift-corrected 30 s heartbeat
    ([5.0, 2.998], 5.0, 8, True),           # a fixed 5 s heartbeat and one of aiokafka's
])
def test_a_scripts_own_moves_count_up_to_a_minute_or_as_one_heartbeat_beat(moves, beat, late, passes):
    callback = new_callback("down")
    failure = START + lab.INTERVAL
    on_topic, _ = _first_and_second(callback, next_time=_ms(failure + lab.INTERVAL + late))
    run = _run(callback, [START, failure])
    run.retry_clock = _clock(moves, beat=beat)
    if passes:
        retry_record.check_handed_back(run, on_topic[1], on_topic)
    else:
        with i18n.use("en"), pytest.raises(CheckFailed, match="not the interval"):
            retry_record.check_handed_back(run, on_topic[1], on_topic)


@pytest.mark.parametrize("script", [lab.MAIN_SCRIPT, lab.RETRY_SCRIPT])
def test_a_scripts_own_wait_after_the_failure_does_not_excuse_a_late_due_time(script):
    # the second review's repros: retry_consumer.py sleeping an interval after a failed retry, consumer.py 120 s
    # after a failed notify, each then writing now + interval: due an interval (120 s) late, which passed 7/7
    callback = new_callback("down")
    waited = lab.INTERVAL if script == lab.RETRY_SCRIPT else 120.0
    failure = types.SimpleNamespace(t=START, offset=0.0)
    record = _record(callback, "1", _ms(START + lab.INTERVAL + waited), 0, START + 0.01, script=script)
    moves = {"moved" if script == lab.RETRY_SCRIPT else "own": waited}     # the other's views: 0 s
    run = _run(callback, [START], **{"own" if script == lab.RETRY_SCRIPT else "moved": waited})
    with i18n.use("en"), pytest.raises(CheckFailed, match="not the interval"):
        retry_record.check_next_time(run, callback, failure, record)
    # the same wait made by the OTHER script is allowed for in full
    retry_record.check_next_time(_run(callback, [START], **moves), callback, failure, record)


def test_an_unchanged_copy_put_back_before_any_new_failure_is_a_requeue_and_passes():
    # a retry consumer that hands a record not yet due back to the topic as it was
    callback = new_callback("down")
    first = _record(callback, "1", _ms(START + lab.INTERVAL), 0, START + 0.01, script=lab.MAIN_SCRIPT)
    copy = _record(callback, "1", _ms(START + lab.INTERVAL), 1, START + 30)
    run = _run(callback, [START])
    retry_record.check_handed_back(run, copy, [first, copy])
    # the same copy made after a second failure is no requeue: its count and due time are stale
    after = _record(callback, "1", _ms(START + lab.INTERVAL), 1, START + lab.INTERVAL + 1)
    with i18n.use("en"), pytest.raises(CheckFailed, match="after 2 failed attempts"):
        retry_record.check_handed_back(_run(callback, [START, START + lab.INTERVAL]), after, [first, after])


def test_a_record_handed_back_before_any_failure_is_left_to_the_counting_steps():
    callback = new_callback("ok")
    stray = _record(callback, "7", "NaN", 0, START)
    retry_record.check_handed_back(_run(callback, []), stray, [stray])


def _requests(*produced: tuple[str, int]):
    """Relay requests of a run: (topic, acks) of each Produce."""
    return [types.SimpleNamespace(acks=acks, produced=(types.SimpleNamespace(topic=topic),))
            for topic, acks in produced]


def test_producing_retry_records_with_acks_0_is_named_whichever_script_did():
    for acks, expected in ((0, lab.RETRY_SCRIPT), (1, None), (-1, None)):
        run = types.SimpleNamespace(main=types.SimpleNamespace(commands=_requests((lab.RETRY_TOPIC, 1))),
                                    retry=types.SimpleNamespace(commands=_requests((lab.RETRY_TOPIC, acks))))
        assert retry_record._produced_with_acks_0(run) == expected
    main_acks_0 = types.SimpleNamespace(main=types.SimpleNamespace(commands=_requests((lab.RETRY_TOPIC, 0))),
                                        retry=None)
    assert retry_record._produced_with_acks_0(main_acks_0) == lab.MAIN_SCRIPT
    dlq_only = types.SimpleNamespace(main=None, retry=types.SimpleNamespace(commands=_requests((lab.DLQ_TOPIC, 0))))
    assert retry_record._produced_with_acks_0(dlq_only) is None     # step 3 judges the retry topic only


@pytest.mark.parametrize("lang", LANGUAGES)
def test_a_record_handed_back_that_carries_no_callback_fails(lang, monkeypatch):
    from retrylab.checks.retry_topics import observe
    monkeypatch.setattr(observe, "require_main", lambda run: None)
    monkeypatch.setattr(observe, "require_state", lambda run: None)
    callback = new_callback("down")
    on_topic, run = _first_and_second(callback)
    unreadable = KafkaRecord(lab.RETRY_TOPIC, 0, 1, key(callback), b'{"b64": "eyJvcmRlcklkIjo="}', (), 0)
    found = records.recognise(unreadable, [callback])
    on_topic[1] = records.LabRecord(found.record, found.callback, found.form, found.fields,
                                    records.Produced(lab.RETRY_SCRIPT, START + lab.INTERVAL + 0.01))
    run.published, run.main, run.retry = [callback], None, None
    run.records = lambda topic: on_topic if topic == lab.RETRY_TOPIC else []
    with i18n.use(lang), pytest.raises(CheckFailed) as failed:
        retry_record.verify(run)
    assert "callbacks.retry[0]@1" in failed.value.message and "b64" in failed.value.message


@pytest.mark.parametrize("lang", LANGUAGES)
def test_a_record_handed_back_without_its_key_fails_naming_retry_consumer(lang):
    callback = new_callback("down")
    on_topic, run = _first_and_second(callback, key=None)
    with i18n.use(lang), pytest.raises(CheckFailed) as failed:
        retry_record.check_handed_back(run, on_topic[1], on_topic)
    assert lab.RETRY_SCRIPT in failed.value.message and key(callback).decode() in failed.value.message


def test_a_bare_tombstone_is_a_marker_and_a_record_without_a_value_but_with_fields_is_no_escape(monkeypatch):
    # the third review's attack: value None, the callback and the stale lab fields in headers, passed 4/4 steps
    from retrylab.checks.retry_topics import observe
    monkeypatch.setattr(observe, "require_main", lambda run: None)
    monkeypatch.setattr(observe, "require_state", lambda run: None)
    callback = new_callback("down")
    on_topic, run = _first_and_second(callback)
    run.published, run.main, run.retry = [callback], None, None
    stale = ((lab.RETRY_TIMES, b"1"), (lab.NEXT_RETRY_TIME, _ms(START + lab.INTERVAL).encode()),
             ("callback", payload(callback)))
    for value, headers, passes in ((None, (), True), (b"", (), False), (None, stale, False)):
        marker = KafkaRecord(lab.RETRY_TOPIC, 0, 2, key(callback), value, headers, 0)
        found = records.recognise(marker, [callback])
        done = records.LabRecord(found.record, found.callback, found.form, found.fields,
                                 records.Produced(lab.RETRY_SCRIPT, START + 2 * lab.INTERVAL))
        run.records = lambda topic, done=done: [*on_topic, done] if topic == lab.RETRY_TOPIC else []
        if passes:
            retry_record.verify(run)
        else:
            with i18n.use("en"), pytest.raises(CheckFailed, match="carries none of the callbacks"):
                retry_record.verify(run)
