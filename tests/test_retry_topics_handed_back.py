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


def _record(callback, retry_times, next_time, offset: int, at: float, script=lab.RETRY_SCRIPT):
    headers = tuple((k, v.encode()) for k, v in ((lab.RETRY_TIMES, retry_times), (lab.NEXT_RETRY_TIME, next_time))
                    if v is not None)
    found = records.recognise(KafkaRecord(lab.RETRY_TOPIC, 0, offset, key(callback), payload(callback), headers, 0),
                              [callback])
    return records.LabRecord(found.record, found.callback, found.form, found.fields, records.Produced(script, at))


def _run(callback, failures: list[float], moved: float = 0.0):
    """A main run whose callback failed at these virtual times (the clock's offset 0: real time = virtual time);
    consumer.py's own clock moves add up to `moved` virtual seconds at any time."""
    calls = [types.SimpleNamespace(t=t, offset=0.0, outcome="error", id=callback["orderId"]) for t in failures]
    return types.SimpleNamespace(calls_of=lambda c, run=None: calls,
                                 main_clock=types.SimpleNamespace(advanced_between=lambda start, end: moved))


def _first_and_second(callback, retry_times="2", next_time=None):
    """consumer.py's record of the first failure (at START) and retry_consumer.py's of the second (one interval
    later), with these fields."""
    second_failure = START + lab.INTERVAL
    first = _record(callback, "1", _ms(START + lab.INTERVAL), 0, START + 0.01, script=lab.MAIN_SCRIPT)
    handed_back = _record(callback, retry_times, next_time or _ms(second_failure + lab.INTERVAL), 1,
                          second_failure + 0.01)
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
        assert "+0 s from the failed retry, not the interval" in failed.value.message


@pytest.mark.parametrize("next_time, words", [
    ("NaN", "not a plausible epoch-milliseconds time"), (_ms(START + 2 * lab.INTERVAL)[:-3], "epoch seconds"),
    ("9" * 5000, "not a plausible epoch-milliseconds time")])
def test_a_record_handed_back_with_garbage_or_seconds_says_so(next_time, words):
    callback = new_callback("down")
    on_topic, run = _first_and_second(callback, next_time=next_time)
    with i18n.use("en"), pytest.raises(CheckFailed, match=words):
        retry_record.check_handed_back(run, on_topic[1], on_topic)


def test_the_main_consumers_clock_moves_are_allowed_for_and_only_they():
    callback = new_callback("down")
    late = _ms(START + lab.INTERVAL + lab.INTERVAL + 60)       # written 60 virtual seconds after the failure
    on_topic, run = _first_and_second(callback, next_time=late)
    with i18n.use("en"), pytest.raises(CheckFailed, match="not the interval"):
        retry_record.check_handed_back(run, on_topic[1], on_topic)
    retry_record.check_handed_back(_run(callback, [START, START + lab.INTERVAL], moved=60.0), on_topic[1], on_topic)


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
