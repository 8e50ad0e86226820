"""retry-topics: whatever a learner's consumer writes into retryTimes and nextRetryTime, the harness reads it
without raising, and the step that judges the field fails with a message naming the value (the hostile-input
hunt's repros: "--1" made int() raise, the right nextRetryTime with 400 zeros after it overflowed a float).
The corpus entries wrong/garbage-retry-times and wrong/garbage-retry-fields-own-state grade the same garbage
end to end (tests/test_retry_topics_corpus.py)."""
from __future__ import annotations

import re
import types

import pytest

from retrylab import i18n
from retrylab.brokers.kafka.state import KafkaRecord, KafkaState
from retrylab.checks.retry_topics import dead_letter, durability, lab, observe, records, retry_record, wait
from retrylab.checks.retry_topics.run_durable import DurableRun
from retrylab.checks.retry_topics.run_main import MainRun
from retrylab.fixtures.retry_topics.callbacks import key, new_callback, payload
from retrylab.verdict import CheckFailed

NOW_MS = 1_796_792_483_965                      # a virtual clock's epoch ms, as a grading sees one
FAR = str(NOW_MS) + "0" * 400                   # the hunt's variant: the right time, 400 zeros after it
LANGUAGES = ("en", "zh", "ru", "fa")


@pytest.mark.parametrize("value, expected", [
    ("1", 1), (" 5", 5), ("5\n", 5), ("+5", 5), ("-0", 0), ("-7", -7), (3, 3), (3.0, 3), (-0.0, 0),
    ("9223372036854775807", 2 ** 63 - 1), ("-9223372036854775808", -2 ** 63),
    ("--1", None), ("+-1", None), ("-", None), ("", None), ("²", None), ("٣", None), ("５", None),
    ("1_000", None), ("1e3", None), ("1.0", None), ("0x10", None), ("NaN", None), ("nan", None),
    ("inf", None), ("-Infinity", None), ("null", None), ("5" * 5000, None), ("9" * 4300, None),
    ("9223372036854775808", None), (FAR, None), (2 ** 63, None), (10 ** 412, None), (float("nan"), None),
    (float("inf"), None), (1e300, None), (2.5, None), (True, None), (None, None), ([1], None), ({"n": 1}, None),
])
def test_whole_number_reads_decimal_text_within_64_bits_and_nothing_else(value, expected):
    assert records.whole_number(value) == expected


@pytest.mark.parametrize("ms, expected", [
    (NOW_MS, NOW_MS / 1000), (0, 0.0), (records.LATEST_MS - 1, (records.LATEST_MS - 1) / 1000),
    (records.LATEST_MS, None), (-1, None), (2 ** 63 - 1, None), (10 ** 412, None),
    (records.whole_number(FAR), None), (None, None), (True, None), (float("nan"), None), (1.7e12, 1.7e9),
    (NOW_MS + 0.5, (NOW_MS + 0.5) / 1000), (float("inf"), None), (-0.5, None),
])
def test_epoch_seconds_converts_only_a_plausible_epoch_ms_time(ms, expected):
    assert records.epoch_seconds(ms) == expected


@pytest.mark.parametrize("value, expected", [
    ("1796833011364", 1796833011364), ("1796833011364.5784", 1796833011364.5784), (" 17.5 ", 17.5),
    (1796833011364.5784, 1796833011364.5784), ("1.", None), (".5", None), ("1.5e3", None), ("1,5", None),
    ("1.0000000001", None), ("NaN", None), (float("nan"), None), (1e300, None), ("--1", None), (True, None),
])
def test_epoch_ms_takes_a_fraction_of_a_millisecond(value, expected):
    # `time.time() * 1000 + interval` is epoch ms: it was "not a plausible epoch-milliseconds time", 4 ms off
    assert records.epoch_ms(value) == expected


def _record(topic: str, callback: dict, headers: dict, offset: int = 0) -> KafkaRecord:
    return KafkaRecord(topic, 0, offset, key(callback), payload(callback),
                       tuple((k, v.encode() if isinstance(v, str) else v) for k, v in headers.items()), NOW_MS)


def _lab_record(topic: str, callback: dict, headers: dict, offset: int = 0, at: float | None = None):
    found = records.recognise(_record(topic, callback, headers, offset), [callback])
    produced = records.Produced(lab.MAIN_SCRIPT, at) if at is not None else None
    return records.LabRecord(found.record, found.callback, found.form, found.fields, produced)


@pytest.mark.parametrize("retry_times, next_time", [
    ("--1", FAR), ("²", "NaN"), ("7" * 5000, "9" * 5000), (b"\xff\xfe", b"\x00"), ("-0", "-1"), ("+5", "+-5")])
def test_a_record_with_garbage_fields_reads_as_no_number_or_the_number_it_is(retry_times, next_time):
    record = _lab_record(lab.RETRY_TOPIC, new_callback("down"),
                         {lab.RETRY_TIMES: retry_times, lab.NEXT_RETRY_TIME: next_time})
    assert record.retry_times == records.whole_number(record.fields[lab.RETRY_TIMES])
    assert records.epoch_seconds(record.next_retry_time) is None     # none of them is a time a clock reaches


def _failure():
    return types.SimpleNamespace(t=NOW_MS / 1000 - lab.INTERVAL, offset=0.0)


@pytest.mark.parametrize("lang", LANGUAGES)
@pytest.mark.parametrize("value", ["--1", "²", "NaN", "7" * 5000, ""])
def test_step3_says_a_garbage_retry_times_is_not_a_whole_number(value, lang):
    callback = new_callback("down")
    record = _lab_record(lab.RETRY_TOPIC, callback, {lab.RETRY_TIMES: value, lab.NEXT_RETRY_TIME: str(NOW_MS)})
    with i18n.use(lang), pytest.raises(CheckFailed) as failed:
        retry_record.check_retry_times(callback, record)
    assert records.shown(value) in failed.value.message
    if lang == "en":
        assert "not a whole number" in failed.value.message


def test_step3_still_says_not_1_for_a_whole_number_other_than_1_and_passes_1():
    callback = new_callback("down")
    for value in ("-0", "+5", " 2"):      # read as 0, 5 and 2: numbers, just not 1
        record = _lab_record(lab.RETRY_TOPIC, callback, {lab.RETRY_TIMES: value})
        with i18n.use("en"), pytest.raises(CheckFailed, match=re.escape(f"= {value}, not 1:")) as failed:
            retry_record.check_retry_times(callback, record)
        assert "whole number" not in failed.value.message
    retry_record.check_retry_times(callback, _lab_record(lab.RETRY_TOPIC, callback, {lab.RETRY_TIMES: " 1"}))


@pytest.mark.parametrize("lang", LANGUAGES)
@pytest.mark.parametrize("value", [FAR, "--1", "NaN", "Infinity", "-1", "9223372036854775807", "9" * 5000])
def test_step3_says_a_garbage_next_retry_time_is_not_a_plausible_time(value, lang):
    callback = new_callback("down")
    record = _lab_record(lab.RETRY_TOPIC, callback, {lab.RETRY_TIMES: "1", lab.NEXT_RETRY_TIME: value})
    with i18n.use(lang), pytest.raises(CheckFailed) as failed:
        retry_record.check_next_time(None, callback, _failure(), record)   # judged before the run is needed
    expected = int((_failure().t + lab.INTERVAL) * 1000)
    assert records.shown(value) in failed.value.message and str(expected) in failed.value.message
    if lang == "en":
        assert "not a plausible epoch-milliseconds time" in failed.value.message


def test_step3_next_time_in_seconds_or_absent_keeps_its_own_message():
    callback = new_callback("down")
    clock = types.SimpleNamespace(advanced_between=lambda start, end: 0.0, advances=())
    main_run = types.SimpleNamespace(main_clock=clock, retry_clock=clock)
    seconds = _lab_record(lab.RETRY_TOPIC, callback, {lab.NEXT_RETRY_TIME: str(NOW_MS // 1000)}, at=NOW_MS / 1000)
    with i18n.use("en"), pytest.raises(CheckFailed, match="epoch seconds, not milliseconds"):
        retry_record.check_next_time(main_run, callback, _failure(), seconds)
    absent = _lab_record(lab.RETRY_TOPIC, callback, {lab.RETRY_TIMES: "1"}, at=NOW_MS / 1000)
    with i18n.use("en"), pytest.raises(CheckFailed, match="has no usable nextRetryTime"):
        retry_record.check_next_time(main_run, callback, _failure(), absent)
    right = _lab_record(lab.RETRY_TOPIC, callback, {lab.NEXT_RETRY_TIME: str(NOW_MS)}, at=NOW_MS / 1000)
    retry_record.check_next_time(main_run, callback, _failure(), right)
    fraction = _lab_record(lab.RETRY_TOPIC, callback, {lab.NEXT_RETRY_TIME: f"{NOW_MS - 4}.5784"}, at=NOW_MS / 1000)
    retry_record.check_next_time(main_run, callback, _failure(), fraction)


def _calls(callback, *times, error="NotifyError: down"):
    return [types.SimpleNamespace(t=t, offset=0.0, outcome="error", error=f"{error} {n}", id=callback["orderId"])
            for n, t in enumerate(times, 1)]


@pytest.mark.parametrize("lang", LANGUAGES)
@pytest.mark.parametrize("value", ["--1", "²", "7" * 5000, "3.5"])
def test_step6_says_a_garbage_retry_times_on_the_dlq_record_is_not_a_whole_number(value, lang, monkeypatch):
    monkeypatch.setattr(observe, "require_pair", lambda run: None)
    monkeypatch.setattr(observe, "require_state", lambda run: None)
    down = new_callback("down")
    calls = _calls(down, 0.0, lab.INTERVAL, 2 * lab.INTERVAL)
    dead = _lab_record(lab.DLQ_TOPIC, down, {lab.RETRY_TIMES: value, "lastError": calls[-1].error})
    main_run = types.SimpleNamespace(scenario=types.SimpleNamespace(down=down), calls_of=lambda c, run=None: calls,
                                     records=lambda topic: [dead] if topic == lab.DLQ_TOPIC else [])
    with i18n.use(lang), pytest.raises(CheckFailed) as failed:
        dead_letter.verify(main_run)
    assert records.shown(value) in failed.value.message
    if lang == "en":
        assert "not a whole number" in failed.value.message
    dead = _lab_record(lab.DLQ_TOPIC, down, {lab.RETRY_TIMES: "3", "lastError": calls[-1].error})
    dead_letter.verify(main_run)        # the same record with retryTimes 3 passes


def test_step4_has_no_due_time_to_hold_a_retry_to_in_garbage_but_still_checks_the_interval(monkeypatch):
    monkeypatch.setattr(observe, "require_pair", lambda run: None)
    monkeypatch.setattr(observe, "require_state", lambda run: None)
    down = new_callback("down")
    start = NOW_MS / 1000
    main_calls = _calls(down, start)
    retry_calls = _calls(down, start + lab.INTERVAL, start + 2 * lab.INTERVAL)
    main, retry = object(), object()

    def run_with(*next_times, calls=retry_calls):
        on_topic = [_lab_record(lab.RETRY_TOPIC, down, {lab.RETRY_TIMES: "1", lab.NEXT_RETRY_TIME: t}, n, at=n)
                    for n, t in enumerate(next_times)]
        by_run = {main: main_calls, retry: calls}
        return types.SimpleNamespace(published=[down], main=main, retry=retry, records=lambda topic: on_topic,
                                     calls_of=lambda c, run=None: by_run[run] if run else main_calls + calls)

    wait.verify(run_with(FAR, "NaN"))
    wait.verify(run_with("--1", "9" * 5000))
    with i18n.use("en"), pytest.raises(CheckFailed, match="before the nextRetryTime"):     # a real due time counts
        wait.verify(run_with(str(int((start + 2 * lab.INTERVAL) * 1000)), FAR))
    with i18n.use("en"), pytest.raises(CheckFailed, match="less than the interval"):
        wait.verify(run_with(FAR, FAR, calls=_calls(down, start + 1, start + 2)))


def test_due_times_and_durable_due_skip_what_is_no_time():
    down = new_callback("down")
    headers = [{lab.RETRY_TIMES: "1", lab.NEXT_RETRY_TIME: FAR}, {lab.RETRY_TIMES: "1", lab.NEXT_RETRY_TIME: "--1"},
               {lab.RETRY_TIMES: "2", lab.NEXT_RETRY_TIME: str(NOW_MS)}, {lab.RETRY_TIMES: "--1"},
               {lab.RETRY_TIMES: "1", lab.NEXT_RETRY_TIME: "9" * 5000}]
    kafka = [_record(lab.RETRY_TOPIC, down, h, n) for n, h in enumerate(headers)]
    state = KafkaState({lab.RETRY_TOPIC: 1}, {(lab.RETRY_TOPIC, 0): kafka}, {})
    main_run = types.SimpleNamespace(records=lambda topic: [records.recognise(r, [down]) for r in kafka])
    assert MainRun.due_times(main_run) == [NOW_MS / 1000]
    durable_run = types.SimpleNamespace(published=[down], state=state)
    assert DurableRun.due_times(durable_run) == [NOW_MS / 1000]
    assert durability.due(durable_run, down["orderId"], 1) is None
    assert durability.due(durable_run, down["orderId"], 2) == NOW_MS / 1000


def test_of_a_header_given_more_than_once_the_last_value_is_read():
    # a retry consumer that keeps the headers it read and appends the new ones (Kafka's Headers.lastHeader reads
    # them): the first value was read, so its DLQ record had retryTimes 1 and the first attempt's error
    record = types.SimpleNamespace(headers=[("retryTimes", b"1"), ("lastError", b"call 1"), ("retryTimes", b"2"),
                                      ("lastError", b"call 2"), ("retryTimes", "3"), ("lastError", b"call 3")])
    assert records._headers(record) == {"retryTimes": "3", "lastError": "call 3"}
