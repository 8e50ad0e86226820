"""retry-topics steps 1-6 and advanced key-order on the reference and on quick wrong variants of it (a copy
of solution/retry-topics with one change each): each variant fails exactly the steps its mistake breaks,
saying so; the reference passes 1-6 and is reported for reordering a key. The curated corpus is
fixtures/retry_topics/submissions (its own test file); these variants pin the checks themselves."""
from __future__ import annotations

import shutil
import threading
import time
import types

import pytest

from retrylab.brokers.kafka import BROKER
from retrylab.brokers.kafka.backend import TansuBackend
from retrylab.checks.retry_topics import (consume, dead_letter, key_order, lab, nonblocking, observe, pair,
                                          retry_record, success_stops, wait)
from retrylab.checks.retry_topics.clock import pair_clocks
from retrylab.checks.retry_topics.run_main import observe_main
from retrylab.fixtures.retry_topics.corpus import REFERENCE
from retrylab.grading import grade
from retrylab.runner import LearnerRunner
from retrylab.settle import Reason, Stop
from retrylab.verdict import CannotJudge, CheckFailed

EXERCISE = "retry-topics"
VERIFIERS = {1: consume, 2: nonblocking, 3: retry_record, 4: wait, 5: success_stops, 6: dead_letter}
MAIN, RETRY = "consumer.py", "retry_consumer.py"

# name -> ({script: [(old, new), ...]} or None: the file removed), the steps that fail, words of the first failure
VARIANTS = {
    "main-sleeps-until-due": (
        {MAIN: [("producer.flush()    # stored", "producer.flush(); time.sleep(RETRY_INTERVAL_MS / 1000)    # stored")]},
        {2}, "waited 600 s"),
    "retry-not-waiting": ({RETRY: [("time.sleep(wait)", "pass")]}, {4}, "before the nextRetryTime"),
    "dlq-without-error": (
        {RETRY: [('headers = [("retryTimes", str(failed).encode()), ("lastError", str(error).encode())]',
                  'headers = [("retryTimes", str(failed).encode())]')]}, {6}, "does not carry the last error"),
    "key-lost-in-dlq": ({RETRY: [("producer.produce(DLQ_TOPIC, key=msg.key()", "producer.produce(DLQ_TOPIC, key=None")]},
                        {6}, "not the original"),
    # the key is lost for good: the DLQ record cannot have it either
    "key-lost-in-retry": ({MAIN: [("producer.produce(RETRY_TOPIC, key=msg.key()", "producer.produce(RETRY_TOPIC, key=None")]},
                          {3, 6}, "not the original"),
    # the record it hands back says 1 failed attempt after 2 (step 3), and down is retried without end (step 6)
    "retry-times-never-rises": ({RETRY: [("failed += 1", "failed = 1")]}, {3, 6}, "retryTimes = 1, after 2 failed"),
    "main-never-commits": ({MAIN: [("consumer.commit(message=msg, asynchronous=False)", "pass")]}, {1}, "committed no offset"),
    "retry-consumer-missing": ({RETRY: None}, {4, 5, 6}, "retry_consumer.py is missing"),
}


@pytest.fixture(scope="module")
def kafka_backend():
    backend = TansuBackend()
    backend.start()
    yield backend
    backend.stop()


def _variant(tmp_path, changes) -> str:
    folder = tmp_path / "submission"
    shutil.copytree(REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    for script, edits in changes.items():
        path = folder / script
        if edits is None:
            path.unlink()
            continue
        text = path.read_text()
        for old, new in edits:
            assert old in text, (script, old)
            text = text.replace(old, new)
        path.write_text(text)
    return folder


def _main_run(folder, kafka_backend):
    learner = LearnerRunner(folder, application="retrylab.fixtures.retry_topics.notifier_app:NotifierApp",
                            learner_imports=BROKER.learner_imports)
    return observe_main(learner, kafka_backend, threading.Event())


def _verdicts(run) -> dict[int, str]:
    """step -> "" (passes) or the failure's message."""
    found = {}
    for number, module in VERIFIERS.items():
        try:
            module.verify(run)
            found[number] = ""
        except CheckFailed as failed:
            found[number] = str(failed)
    return found


def test_the_reference_passes_1_to_6_ends_when_done_and_is_reported_for_key_order(kafka_backend):
    run = _main_run(REFERENCE, kafka_backend)
    assert _verdicts(run) == {n: "" for n in VERIFIERS}
    assert run.stop.reason == Reason.DONE_WAITED, run.stop
    with pytest.raises(CheckFailed, match="seed's design accepts this trade-off"):
        key_order.verify(run)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_wrong_variant_fails_only_the_steps_its_mistake_breaks(name, tmp_path, kafka_backend):
    changes, failing, words = VARIANTS[name]
    run = _main_run(_variant(tmp_path, changes), kafka_backend)
    verdicts = _verdicts(run)
    assert {n for n, message in verdicts.items() if message} == failing, verdicts
    first = verdicts[min(failing)]
    assert words in first and "Traceback" not in first, first


# consumer.py parks a key's later records behind its pending retry (on the retry topic, due at once): the
# retry consumer, reading a partition in order, notifies them after the retried one
KEEPS_KEY_ORDER = {MAIN: [
    ("    consumer.subscribe([TOPIC])\n", "    consumer.subscribe([TOPIC])\n    parked = set()\n"),
    ("            try:\n                notifier.notify(json.loads(msg.value()))\n"
     "            except notifier.NotifyError as error:\n",
     "            if msg.key() in parked:\n"
     "                due = str(int(time.time() * 1000)).encode()\n"
     "                producer.produce(RETRY_TOPIC, key=msg.key(), value=msg.value(),\n"
     "                                 headers=[('retryTimes', b'0'), ('nextRetryTime', due)])\n"
     "                producer.flush()\n"
     "                consumer.commit(message=msg, asynchronous=False)\n"
     "                continue\n"
     "            try:\n                notifier.notify(json.loads(msg.value()))\n"
     "            except notifier.NotifyError as error:\n                parked.add(msg.key())\n")]}


def test_a_pair_that_keeps_a_keys_order_passes_key_order_and_steps_1_to_6(tmp_path, kafka_backend):
    run = _main_run(_variant(tmp_path, KEEPS_KEY_ORDER), kafka_backend)
    assert _verdicts(run) == {n: "" for n in VERIFIERS}
    key_order.verify(run)


def test_a_pair_retrying_without_end_is_stopped_as_such(tmp_path, kafka_backend):
    changes, _failing, _words = VARIANTS["retry-times-never-rises"]
    run = _main_run(_variant(tmp_path, changes), kafka_backend)
    assert run.stop.reason == Reason.CAP and "without end" in run.stop.detail, run.stop


def test_broken_submissions_fail_every_step_with_a_message_not_a_traceback(tmp_path):
    (tmp_path / "empty").mkdir()
    crashing = tmp_path / "crashing"
    crashing.mkdir()
    (crashing / MAIN).write_text("import confluent_kafka\nraise SystemExit('no broker configured')\n")
    (crashing / RETRY).write_text("def main(:\n")
    for folder, words in ((tmp_path / "empty", "consumer.py is missing"), (crashing, "no broker configured")):
        report = grade(folder, exercise_id=EXERCISE, steps=tuple(VERIFIERS))
        results = {r.number: r for r in report.lab_results if r.number in VERIFIERS}
        assert {n: r.status for n, r in results.items()} == {n: "fail" for n in VERIFIERS}, report
        assert words in results[1].message and "Traceback (most recent call last)" not in results[1].message


# -- how long the harness waits for a pair -------------------------------------------------------------------

def test_a_wait_outlasts_its_limit_only_while_the_clock_moves_toward_a_due_time():
    """A paused retry consumer polling toward its due time moves the clock in real-time slices, which a busy machine
    stretches: past SETTLE_LIMIT the wait goes on while the clock moved in the last MOVING s, by less than
    MOVING_SPAN since the wait began (a correct pair needs 2 intervals), and never past MOVING_LIMIT."""
    watch = pair.ClockWatch(now=0.0)
    assert watch.look(1000.0, now=0.0)                       # the wait begins: clock at 1000
    assert watch.look(1600.0, now=26.0)                      # 600 s later, still moving
    assert not pair.out_of_time(26.0, pair.SETTLE_LIMIT, pair.MOVING_LIMIT, moving=True)
    assert pair.out_of_time(26.0, pair.SETTLE_LIMIT, pair.MOVING_LIMIT, moving=False)
    assert pair.out_of_time(pair.MOVING_LIMIT, pair.SETTLE_LIMIT, pair.MOVING_LIMIT, moving=True)
    assert not pair.out_of_time(10.0, pair.SETTLE_LIMIT, pair.MOVING_LIMIT, moving=False)
    assert not watch.look(1600.0, now=26.0 + pair.MOVING)    # not moved for MOVING s: waiting for nothing
    assert watch.look(1700.0, now=28.0) and watch.moved == 28.0
    # a clock moved by MOVING_SPAN since the wait began waits for nothing a correct pair waits for (a retry a
    # hundred years ahead, retries without end): the plain limit holds
    assert not watch.look(1000.0 + pair.MOVING_SPAN, now=29.0)
    assert pair.MOVING_SPAN >= (lab.MAX_ATTEMPTS - 1) * lab.INTERVAL + lab.INTERVAL
    assert pair.RUN_TIMEOUT >= pair.START_LIMIT + pair.MOVING_LIMIT


class _Watch(pair.PairWatch):
    """Both runs going, nothing done, and the clock moving at `pace` virtual seconds per real second."""

    def __init__(self, pace: float):
        super().__init__(threading.Event())
        self.pace, self.began = pace, time.monotonic()

    def clock(self) -> float:
        return self.pace * (time.monotonic() - self.began)

    def signature(self) -> tuple:
        return (self.clock(),)


def _settle(pace: float) -> tuple[pair.LivePair, Stop]:
    _shared, main_clock, retry_clock = pair_clocks(MAIN, RETRY)
    live = pair.LivePair(learner=types.SimpleNamespace(), endpoint=None, app=None, main_clock=main_clock,
                         retry_clock=retry_clock)
    live.watch = _Watch(pace)
    # the moving limit past MOVING: a pace is taken over MOVING real seconds at least
    stop = live.settle(done=lambda watch: False, cap=lambda watch: None, limit=pair.MOVING,
                       moving_limit=2 * pair.MOVING)
    return live, stop


def _run(cut, *due_in: float):
    """A run cut so, with retry records due `due_in` virtual seconds after the cut."""
    due = [cut.clock + d for d in due_in] if cut is not None else []
    return types.SimpleNamespace(cut=cut, due_times=lambda: due)


@pytest.mark.parametrize("pace, judged", [(pair.MIN_PACE * 2, False), (pair.MIN_PACE / 4, True)])
def test_a_pair_cut_by_the_moving_limit_while_its_clock_keeps_pace_is_not_judged_on_what_it_had_not_done(
        pace, judged):
    """A busy machine slows a correct pair's polls toward its due time: cut at MOVING_LIMIT while its clock still
    moved at MIN_PACE or faster, with a retry still due, the steps that wait for what it had not done yet say
    "not graded". A clock that crawls (a retry consumer polling with 1 ms timeouts) is judged as it stands, a quiet
    machine would not help, and the failure says why the pair did not finish."""
    live, stop = _settle(pace)
    assert stop.reason == Reason.CAP and "still going" in stop.detail, stop
    assert live.cut is not None and pace * 0.7 <= live.cut.pace <= pace * 1.2, live.cut
    with pytest.raises(CheckFailed if judged else CannotJudge) as raised:
        observe.incomplete(_run(live.cut, lab.INTERVAL / 2), "too few calls")
    assert ("too few calls" in str(raised.value)) is judged
    assert ("Poll with a timeout of about a second" if judged else "too busy") in str(raised.value)
    assert f"limit of {2 * pair.MOVING:.0f} s ran out" in str(raised.value)     # the wait's own limit
    # a retry only just due counts (the pair was about to make it); a clock moved past every due time, or toward one
    # further than an interval (a retry a hundred years ahead), or a pair the limit did not cut, is judged
    with pytest.raises(CheckFailed if judged else CannotJudge):
        observe.incomplete(_run(live.cut, -observe.DUE_SLACK / 2), "too few calls")
    for run in (_run(live.cut), _run(live.cut, -2 * observe.DUE_SLACK, -lab.INTERVAL), _run(None),
                _run(live.cut, 100 * 365 * 86400.0), _run(live.cut, 2 * lab.INTERVAL)):
        with pytest.raises(CheckFailed, match="^too few calls$"):
            observe.incomplete(run, "too few calls")


def test_a_wait_ended_by_its_plain_limit_or_a_clock_that_stopped_cut_nothing_short():
    watch = pair.ClockWatch(now=0.0)
    watch.look(0.0, now=0.0)
    watch.look(0.0, now=5.0)                                # the pair handles records: the clock stays
    watch.look(50.0, now=6.0)                               # then moves: its pace counts from its first move
    watch.look(1000.0, now=25.0)                            # about 50 virtual s per real s, still moving
    assert watch.pace(25.0) == 1000.0 / 19.0
    assert watch.cut(25.0, 7.0, 25.0, 50.0) == pair.Cut(watch.pace(25.0), 7.0, 50.0)
    assert watch.cut(25.0, 7.0, 50.0, 50.0) is None         # no moving limit: the plain limit cut nothing short
    watch.look(1000.0, now=25.0 + pair.MOVING)              # then no move for MOVING s: waiting for nothing
    assert watch.cut(25.0 + pair.MOVING, 7.0, 25.0, 50.0) is None
    live, stop = _settle(pace=0.0)                          # the clock never moved: the plain limit, a verdict
    assert live.cut is None and stop.reason == Reason.CAP


class _Script:
    """One script of a pair as a stop condition sees it: it sent commands, changed nothing since, and used `cpu`."""

    def __init__(self):
        self.cpu_used = 0.0
        self.changes = 1            # its first broker command

    def started(self) -> bool:
        return True

    def cpu(self) -> float:
        return self.cpu_used


@pytest.mark.parametrize("clock_step, stopped_at", [
    (0.0, pair.STUCK_CPU),                       # a spin that never moves the clock
    (pair.MOVING_SPAN / 10, 10 * 0.5 + pair.STUCK_CPU),   # moves it without end: counted once past MOVING_SPAN
    (1.0, None),                                 # a paused consumer polling toward its due time: never stuck
])
def test_a_pair_script_spins_only_while_the_clock_stays_or_has_moved_past_what_a_due_time_needs(
        clock_step, stopped_at):
    watch = pair.PairWatch(threading.Event())
    offset = [0.0]
    watch.clock = lambda: offset[0]
    stuck, script = pair._Stuck(watch), _Script()
    stopped = None
    for look in range(1, 41):                    # 0.5 CPU-s a look, 20 CPU-s in all
        script.cpu_used, offset[0] = look * 0.5, offset[0] + clock_step
        if stuck.check(script) is not None:
            stopped = script.cpu_used
            break
    assert stopped == (stopped_at if stopped_at is None else pytest.approx(stopped_at, abs=0.5)), stopped
