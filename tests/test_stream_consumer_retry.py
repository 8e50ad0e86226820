"""stream-consumer steps 2 (retry) and 3 (dlq): the reference passes steps 1-3 and each of the corpus
entries about retries and dead letters gets its expected verdicts for steps 1-3, on both backends (an
entry's: in the full grading the corpus test reads too, tests/gradings.py); the
rules the checks use (redelivery evidence, the quiet stop) on hand-made records."""
from __future__ import annotations

import dataclasses
import itertools
import time
from types import SimpleNamespace

import pytest

from retrylab.brokers.redis.commands import Command
from retrylab.checks.stream_consumer import lab, redelivery, run_retry, settling
from retrylab.checks.stream_consumer.test_step2_retry import RERUNS
from retrylab.fixtures.stream_consumer import corpus
from retrylab.fixtures.stream_consumer.corpus import REFERENCE
from retrylab.grading import grade

EXERCISE = "stream-consumer"
BACKENDS = ["fake", "redis-server"]
STEPS = (1, 2, 3)
# this area's entries: those whose consumer.py is about retries and dead letters
NAMES = {"immediate-endless-retries", "reread-own-pending-at-once", "constant-min-idle", "no-dlq-retries-forever",
         "poison-dropped", "xack-before-effect", "dlq-after-2-deliveries", "dlq-after-4-deliveries",
         "dlq-entry-bare", "dlq-as-list", "key-kept-on-failure", "fabricated-dead-letter", "retry-in-line",
         "fixed-consumer-name", "bytes-fields", "xautoclaim-per-delivery", "deliveries-from-xpending",
         "not-before-schedule", "never-xacks",
         "xclaim-justid-retrycount", "xautoclaim-for-show", "own-schedule-blocking-read"}
ENTRIES = [e for e in corpus.entries() if e.name in NAMES]


def _results(report):
    return [r for r in report.lab_results if r.number in STEPS]


def _verdicts(report) -> dict[int, str]:
    return {r.number: r.status for r in _results(report)}


def _explain(report) -> str:
    return "\n".join(f"step {r.number} {r.status}: {r.message}" for r in _results(report))


def test_every_entry_of_this_area_is_in_the_corpus():
    assert {e.name for e in ENTRIES} == NAMES
    assert all(set(e.expect) == set(range(1, 7)) for e in ENTRIES)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reference_passes_steps_1_to_3(backend):
    report = grade(REFERENCE, backend=backend, steps=STEPS, exercise_id=EXERCISE)
    assert _verdicts(report) == {n: "pass" for n in STEPS}, _explain(report)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_entry_gets_its_verdicts_for_steps_1_to_3(entry, backend, shared_gradings):
    report = shared_gradings.entry(EXERCISE, entry, backend)
    assert _verdicts(report) == {n: entry.expect[n] for n in STEPS}, f"{entry.id}: {entry.why}\n{_explain(report)}"
    for result in _results(report):
        if result.status == "fail":   # says what is wrong, then the hint; never a harness error
            assert result.message.strip() and "Hint:" in result.message, result.message
            assert "Traceback" not in result.message
    # step 2 makes the retry run: a wrong consumer is stopped by the quiet rule or a cap, not the outer limit
    step2 = next(r for r in report.lab_results if r.number == 2)
    assert step2.seconds < settling.RUN_TIMEOUT - 1, step2.seconds


# --------------------------------------------------------------------------------------------
# the rules, on hand-made records

ENTRY = b"1700000000000-1"


_SEQ = itertools.count()     # the relay numbers commands in the order they come: here, the order they are made


def _command(at: float, *args: bytes, answered_at: float | None = None) -> Command:
    return Command(seq=next(_SEQ), conn=1, at=at, args=args, truncated=False, answered_at=answered_at)


def _call(t: float, outcome: str, cpu_wait: float | None = None, peer: int | None = 7,
          order: str = "ord-flaky") -> SimpleNamespace:
    return SimpleNamespace(t=t, outcome=outcome, cpu_wait=cpu_wait, peer=peer, id=order)


def test_a_claim_is_an_xclaim_naming_the_entry_or_any_xautoclaim_on_orders():
    assert redelivery.is_claim(_command(0, b"XCLAIM", b"orders", b"workers", b"c", b"200", ENTRY), ENTRY)
    assert not redelivery.is_claim(_command(0, b"XCLAIM", b"orders", b"workers", b"c", b"200", b"1-1"), ENTRY)
    assert redelivery.is_claim(_command(0, b"xautoclaim", b"orders", b"workers", b"c", b"400", b"0-0"), ENTRY)
    assert not redelivery.is_claim(_command(0, b"XAUTOCLAIM", b"other", b"workers", b"c", b"400", b"0-0"), ENTRY)
    # an XAUTOCLAIM that starts past the entry cannot take it (wrong/xautoclaim-for-show's, from 9999999999999-0)
    assert not redelivery.is_claim(_command(0, b"XAUTOCLAIM", b"orders", b"workers", b"c", b"400",
                                            b"9999999999999-0"), ENTRY)
    assert not redelivery.is_claim(_command(0, b"XAUTOCLAIM", b"orders", b"workers", b"c", b"400",
                                            b"1700000000000-2"), ENTRY)
    assert redelivery.is_claim(_command(0, b"XAUTOCLAIM", b"orders", b"workers", b"c", b"400", b"-"), ENTRY)
    assert redelivery.is_claim(_command(0, b"XAUTOCLAIM", b"orders", b"workers", b"c", b"400", ENTRY), ENTRY)
    assert not redelivery.is_claim(_command(0, b"XAUTOCLAIM", b"orders", b"workers", b"c", b"400"), ENTRY)
    assert redelivery.min_idle_ms(_command(0, b"XAUTOCLAIM", b"orders", b"workers", b"c", b"400", b"0-0")) == 400
    assert redelivery.min_idle_ms(_command(0, b"XCLAIM", b"orders", b"workers", b"c", b"soon", ENTRY)) is None
    assert redelivery.min_idle_ms(_command(0, b"XCLAIM", b"orders")) is None


def test_each_redelivery_takes_the_min_idle_of_the_last_claim_before_it():
    calls = [_call(10.0, "error"), _call(10.3, "error"), _call(10.8, "ok")]
    commands = [_command(10.1, b"XCLAIM", b"orders", b"workers", b"c", b"100", ENTRY),
                _command(10.25, b"XCLAIM", b"orders", b"workers", b"c", b"200", ENTRY),
                _command(10.7, b"XACK", b"orders", b"workers", ENTRY)]
    first, second = redelivery.redeliveries(calls, commands, ENTRY)
    assert (first.min_idle_ms, second.min_idle_ms) == (200, None)
    # the second wait counts, at most, from the claim that delivered the entry before its failed call
    assert first.gap == pytest.approx(0.3) and second.gap == pytest.approx(0.55)
    assert (first.call_gap, second.call_gap) == (pytest.approx(0.3), pytest.approx(0.5))
    assert redelivery.acks(commands, ENTRY) == commands[2:]


def _read(at: float, entry_id: bytes) -> Command:
    return _command(at, b"XREADGROUP", b"GROUP", b"workers", b"c", b"COUNT", b"10", b"STREAMS", b"orders", entry_id)


def test_a_failed_call_that_reaches_the_harness_late_does_not_make_the_wait_look_immediate():
    """A batch read at 10.0, the flaky entry's call reaching the harness 160 ms later (a busy machine, entries
    before it in the batch), a claim of min-idle 200 ms: 90 ms between the calls, but at least 250 ms of wait."""
    calls = [_call(10.16, "error"), _call(10.25, "ok")]
    commands = [_read(10.0, b">"), _command(10.21, b"XCLAIM", b"orders", b"workers", b"c", b"200", ENTRY)]
    (again,) = redelivery.redeliveries(calls, commands, ENTRY)
    assert again.gap == pytest.approx(0.25) and again.gap >= lab.MIN_RETRY_GAP
    assert redelivery.claimed_with(again) == 200


def test_a_claim_for_show_followed_by_a_reread_of_the_pending_list_gives_no_min_idle():
    calls = [_call(10.0, "error"), _call(10.16, "error"), _call(10.32, "ok")]
    commands = [_command(10.1, b"XAUTOCLAIM", b"orders", b"workers", b"c", b"200", b"9999999999999-0"),
                _read(10.14, b"0"),
                _command(10.26, b"XAUTOCLAIM", b"orders", b"workers", b"c", b"400", b"9999999999999-0"),
                _read(10.30, b"0")]
    first, second = redelivery.redeliveries(calls, commands, ENTRY)
    assert (first.min_idle_ms, second.min_idle_ms) == (None, None)
    assert not redelivery.waits_grow(first, second)


def test_a_redelivery_that_skips_apply_is_seen_in_the_pending_count_or_an_xclaim_after_the_last_call():
    calls = [_call(10.0, "error")]
    assert redelivery.skipped(calls, [], ENTRY, SimpleNamespace(deliveries=2))
    assert not redelivery.skipped(calls, [], ENTRY, SimpleNamespace(deliveries=1))
    claimed_then_acked = [_command(10.3, b"XCLAIM", b"orders", b"workers", b"c", b"200", ENTRY),
                          _command(10.31, b"XACK", b"orders", b"workers", ENTRY)]
    assert redelivery.skipped(calls, claimed_then_acked, ENTRY, None)
    acked_at_once = [_command(10.01, b"XACK", b"orders", b"workers", ENTRY),
                     _command(10.3, b"XCLAIM", b"orders", b"workers", b"c", b"200", ENTRY)]
    assert not redelivery.skipped(calls, acked_at_once, ENTRY, None)   # the claim found nothing to take


@pytest.mark.parametrize("gaps, idles, grows", [
    ((0.25, 0.45), (200, 400), True),      # the reference
    ((0.29, 0.33), (200, 400), True),      # judged on the min-idle: the observed waits alone are too close
    ((0.21, 0.29), (200, 200), False),     # a constant min-idle, the poll's jitter making the 2nd longer
    ((0.21, 0.29), (None, None), False),
    ((0.25, 0.45), (100, 100), True),      # own schedule, constant guard min-idle: judged on the waits
    ((0.25, 0.45), (50, 80), True),
    ((0.12, 0.15), (50, 80), False),       # min-idle under MIN_RETRY_GAP counts for nothing
    ((0.15, 0.15), (200, 400), False),     # a claim for show: 150 ms is not 400 ms of idle time
    ((0.21, 0.31), (200, 400), True),      # 100 ms of work between the delivery and the call is allowed
])
def test_the_second_wait_must_be_longer(gaps, idles, grows):
    first = redelivery.Redelivery(0.0, gaps[0], idles[0])
    second = redelivery.Redelivery(gaps[0], gaps[0] + gaps[1], idles[1])
    assert redelivery.waits_grow(first, second) is grows


@pytest.mark.parametrize("gaps, stretched, busy, grows", [
    # CI (cd7e80a, redis-server) and bench/step2_stall.py: wrong/constant-min-idle kept from a CPU for 0.6 s in
    # its second wait passed; not-before-schedule kept from it in its first wait failed
    ((0.25, 0.85), (0.0, 0.6), (0.0, 0.0), None),
    ((0.84, 0.42), (0.6, 0.0), (0.0, 0.0), None),
    ((0.25, 0.85), (0.0, 0.1), (0.0, 0.0), True),    # 750 ms even without the 100 ms of waiting: grows
    ((0.25, 0.30), (0.01, 0.02), (0.0, 0.0), False),     # 240 ms at least, then 300 ms at most: does not
    ((0.84, 0.30), (0.6, 0.0), (0.0, 0.0), False),   # a first gap 240 ms at least, a second of 300 ms at most
    # bench/load_agreement.py --load: constant-min-idle, 1.1 s of its second wait on the orders added meanwhile
    ((0.32, 1.49), (0.14, 0.25), (0.0, 1.1), None),
    ((0.25, 0.45), (0.01, 0.01), (0.0, 0.02), True),     # a quiet machine: milliseconds of other work
])
def test_the_gaps_decide_only_if_they_would_without_what_a_busy_machine_adds(gaps, stretched, busy, grows):
    first = redelivery.Redelivery(0.0, gaps[0], None, stretched=stretched[0], busy=busy[0])
    second = redelivery.Redelivery(gaps[0], gaps[0] + gaps[1], None, stretched=stretched[1], busy=busy[1])
    assert redelivery.waits_grow(first, second) is grows


def test_the_most_a_first_wait_may_have_been_counts_from_the_entrys_delivery():
    """A constant min-idle of 200 ms whose first delivery was read in a batch: its failed call came 100 ms after
    the read (the work on the entries before it, slow on a busy machine), so 150 ms between the calls; then
    300 ms. From the delivery, 250 ms and 300 ms: not growing."""
    calls = [_call(10.1, "error"), _call(10.25, "error"), _call(10.55, "ok")]
    commands = [_read(10.0, b">"), _xclaim(10.24, 200), _xclaim(10.54, 200)]
    first, second = redelivery.redeliveries(calls, commands, ENTRY)
    assert first.quiet_gap == (pytest.approx(0.15), pytest.approx(0.25))
    assert redelivery.waits_grow(first, second) is None       # 300 ms is not 100 ms more than up to 250 ms


def test_the_time_a_consumer_spends_on_other_orders_in_a_wait_is_known():
    """From each call or command about another order to the consumer's next call or command."""
    other_entry = b"1700000000000-2"
    commands = [_command(10.05, b"XACK", b"orders", b"workers", other_entry),
                _command(10.10, b"XPENDING", b"orders", b"workers", b"IDLE", b"200", b"-", b"+", b"10"),
                _command(10.20, b"SET", b"orders:done:ord-other", b"x"),
                _command(10.45, b"XCLAIM", b"orders", b"workers", b"c", b"200", ENTRY),
                _command(10.46, b"SET", b"orders:done:ord-flaky", b"x")]
    calls = [_call(10.0, "error"), _call(10.30, "ok", order="ord-other"), _call(10.50, "ok")]
    (again,) = redelivery.redeliveries([calls[0], calls[2]], commands, ENTRY, calls,
                                       redelivery.Orders(frozenset({b"ord-other"}), frozenset({other_entry})))
    # 10.05-10.10 (the XACK), 10.20-10.30 (its key), 10.30-10.45 (its call): 0.30 s
    assert again.busy == pytest.approx(0.30)
    (alone,) = redelivery.redeliveries([calls[0], calls[2]], commands, ENTRY)
    assert alone.busy == 0.0


def test_a_wait_for_a_reply_later_than_a_quiet_server_gives_it_is_known():
    """A command answered past QUIET_REPLY, a blocking read past its timeout and QUIET_TIMEOUT: the late part, inside
    the gap, once where such waits overlap each other or the work on other orders."""
    xpending = (b"XPENDING", b"orders", b"workers", b"IDLE", b"200", b"-", b"+", b"10")
    blocking = (b"XREADGROUP", b"GROUP", b"workers", b"c", b"BLOCK", b"100", b"STREAMS", b"orders", b">")
    commands = [_command(10.05, *xpending, answered_at=10.0505),           # quiet: not late
                _command(10.10, *xpending, answered_at=10.30),             # late from 10.102
                _command(10.20, *xpending, answered_at=10.25),             # within the one before
                _command(10.30, *blocking, answered_at=10.45),             # its 100 ms, and 100 ms more: not late
                _command(10.45, *blocking, answered_at=10.70),             # late from 10.65
                _command(10.70, *blocking[:4], b"BLOCK", b"0", *blocking[6:], answered_at=10.95),   # for ever
                _command(10.95, b"XCLAIM", b"orders", b"workers", b"c", b"200", ENTRY, answered_at=11.10)]
    spans = redelivery.slow_replies(commands, 10.0, 11.0)
    assert spans == [(pytest.approx(10.102), 10.30), (pytest.approx(10.202), 10.25), (pytest.approx(10.65), 10.70),
                     (pytest.approx(10.952), 11.0)]
    assert redelivery.covered(spans) == pytest.approx(0.198 + 0.05 + 0.048)
    assert redelivery.covered([(1.0, 2.0), (1.5, 3.0), (4.0, 4.5), (4.1, 4.2)]) == pytest.approx(2.5)
    assert redelivery.covered([]) == 0.0
    calls = [_call(10.0, "error"), _call(11.0, "ok")]
    (again,) = redelivery.redeliveries(calls, commands, ENTRY)
    assert again.busy == pytest.approx(0.296)


def test_a_constant_min_idle_whose_second_wait_a_slow_server_lengthened_is_not_judged_on_it():
    """wrong/constant-min-idle, its looks for the entry answered 200 ms late in its second wait only: 450 ms
    between the calls, of which 200 ms a quiet server would not have taken, against 250 ms first."""
    look = (b"XPENDING", b"orders", b"workers", b"IDLE", b"200", b"-", b"+", b"10")
    calls = [_call(10.0, "error"), _call(10.25, "error"), _call(10.70, "ok")]
    quick = [_read(9.99, b">"), _command(10.05, *look, answered_at=10.0503), _xclaim(10.24, 200)]
    slow = [_command(10.30, *look, answered_at=10.50), _command(10.69, b"XCLAIM", b"orders", b"workers", b"c",
                                                                 b"200", ENTRY)]
    first, second = redelivery.redeliveries(calls, quick + slow, ENTRY)
    assert redelivery.waits_grow(first, second) is None
    unanswered = [dataclasses.replace(c, answered_at=None) for c in quick + slow]   # the relay did not time them
    assert redelivery.waits_grow(*redelivery.redeliveries(calls, unanswered, ENTRY)) is True


def _counting_runs(monkeypatch) -> list:
    """Counts the retry runs a grading makes (each makes its EffectsApp)."""
    made, real = [], run_retry.EffectsApp

    def make(**kwargs):
        made.append(1)
        return real(**kwargs)
    monkeypatch.setattr(run_retry, "EffectsApp", make)
    return made


def test_a_run_whose_waits_a_busy_machine_may_have_decided_is_made_again(monkeypatch):
    made, real, answers = _counting_runs(monkeypatch), redelivery.waits_grow, iter([None])
    monkeypatch.setattr(redelivery, "waits_grow", lambda first, second: next(answers, real(first, second)))
    report = grade(REFERENCE, backend="fake", steps=(2,), exercise_id=EXERCISE)
    assert _verdicts(report) == {2: "pass"}, _explain(report)
    assert len(made) == 2


def test_a_step_2_no_run_can_time_is_not_graded_and_says_why(monkeypatch):
    made = _counting_runs(monkeypatch)
    monkeypatch.setattr(redelivery, "waits_grow", lambda first, second: None)
    report = grade(REFERENCE, backend="fake", steps=(2,), exercise_id=EXERCISE)
    (result,) = _results(report)
    assert result.status == "error" and len(made) == 1 + RERUNS
    assert result.message.startswith(
        f"not graded: this machine was too busy to time the flaky order's waits ({1 + RERUNS} runs")
    assert "Traceback" not in result.message and report.exit_status() == 2


def test_each_redelivery_knows_how_long_its_process_waited_for_a_cpu_in_its_gap():
    """From the calls' cpu_wait; calls of another process, or without a cpu_wait, allow nothing."""
    calls = [_call(10.0, "error", 1.05), _call(10.3, "error", 1.45), _call(10.8, "ok", 1.5)]
    first, second = redelivery.redeliveries(calls, [], ENTRY)
    assert (first.stretched, second.stretched) == (pytest.approx(0.4), pytest.approx(0.05))
    assert redelivery.cpu_waited(calls[0], _call(10.1, "ok", 1.1, peer=8)) == 0.0    # another process's
    assert redelivery.cpu_waited(_call(9.9, "ok", 1.0, peer=None), calls[0]) == 0.0     # the kernel did not say
    assert redelivery.cpu_waited(_call(1, "ok"), calls[0]) == 0.0       # not known
    assert redelivery.cpu_waited(calls[1], calls[0]) == 0.0             # never less than nothing


class _Progress:
    def __init__(self):
        self.called, self.shape = [], ()
        self.link = SimpleNamespace(shape=lambda: self.shape)

    def calls(self):
        return self.called


def test_quiet_counts_from_the_moment_every_order_was_called_and_restarts_at_each_change():
    progress, ready = _Progress(), [False]
    quiet = settling.quiet_for(lambda p: ready[0], 0.05)
    assert not quiet(progress)
    time.sleep(0.06)
    assert not quiet(progress)          # not ready: a slow start is never quiet
    ready[0] = True
    assert not quiet(progress)
    time.sleep(0.06)
    assert quiet(progress)
    progress.called.append("call")      # a change: the quiet starts again
    assert not quiet(progress)
    progress.shape = (("orders:dlq", "stream", 1),)
    time.sleep(0.03)
    assert not quiet(progress)
    time.sleep(0.06)
    assert quiet(progress)


def _xpending(at: float, idle_ms: int, start: bytes = b"-", end: bytes = b"+") -> Command:
    return _command(at, b"XPENDING", b"orders", b"workers", b"IDLE", str(idle_ms).encode(), start, end, b"100")


def _xclaim(at: float, idle_ms: int) -> Command:
    return _command(at, b"XCLAIM", b"orders", b"workers", b"c", str(idle_ms).encode(), ENTRY)


def _constant_min_idle(late: float) -> tuple[list, list]:
    """A consumer that looks every 100 ms (XPENDING IDLE 200) and claims what it lists (XCLAIM 200): both waits
    are 200 ms; the second claim reaches the harness `late` s after the entry was first due (a busy machine)."""
    calls = [_call(10.0, "error"), _call(10.23, "error"), _call(10.45 + late, "ok")]
    commands = [_read(9.99, b">"), _xpending(10.1, 200), _xpending(10.2, 200), _xclaim(10.201, 200),
                _xpending(10.33, 200), _xpending(10.43 + late, 200), _xclaim(10.431 + late, 200)]
    return calls, commands


def test_equal_min_idle_claimed_when_first_due_does_not_grow_however_late_the_second_gap():
    """CI (a6ca961, fake): wrong/constant-min-idle passed step 2 when a busy machine stretched its second gap
    by over 100 ms. It claimed at its first look that could find the entry due both times: its waits were 200 ms."""
    for late in (0.0, 0.15, 0.4):
        first, second = redelivery.redeliveries(*_constant_min_idle(late), ENTRY)
        assert (first.eager, second.eager) == (True, True)
        assert (first.min_idle_ms, second.min_idle_ms) == (200, 200)
        assert not redelivery.waits_grow(first, second)


def test_a_consumer_that_passes_by_a_due_entry_keeps_its_own_schedule_and_is_judged_on_its_gaps():
    """not-before-schedule: XPENDING IDLE 100 every 100 ms, XCLAIM 100 once its own 200/400 ms schedule is due."""
    calls = [_call(10.0, "error"), _call(10.22, "error"), _call(10.64, "ok")]
    commands = [_read(9.99, b">"), _xpending(10.1, 100), _xpending(10.2, 100), _xclaim(10.201, 100),
                _xpending(10.32, 100), _xpending(10.42, 100), _xpending(10.52, 100), _xpending(10.62, 100),
                _xclaim(10.621, 100)]
    first, second = redelivery.redeliveries(calls, commands, ENTRY)
    assert not second.eager     # passed by an entry surely due at 10.42 and 10.52
    assert redelivery.waits_grow(first, second)


def test_a_consumer_that_sleeps_its_waits_out_is_judged_on_its_gaps():
    calls = [_call(10.0, "error"), _call(10.21, "error"), _call(10.62, "ok")]
    commands = [_read(9.99, b">"), _xclaim(10.2, 100), _xclaim(10.61, 100)]
    first, second = redelivery.redeliveries(calls, commands, ENTRY)
    assert (first.eager, second.eager) == (False, False)    # no look before the claim: nothing says why it waited
    assert redelivery.waits_grow(first, second)


def test_looks_at_the_pending_list_are_xpending_ranges_holding_the_entry_and_claims():
    assert redelivery.look_threshold(_xpending(0, 250), ENTRY) == 250
    assert redelivery.look_threshold(_command(0, b"XPENDING", b"orders", b"workers", b"-", b"+", b"10"), ENTRY) == 0
    assert redelivery.look_threshold(_xpending(0, 250, start=b"(" + ENTRY), ENTRY) == 250
    assert redelivery.look_threshold(_xpending(0, 250, start=b"1700000000001"), ENTRY) is None
    assert redelivery.look_threshold(_xpending(0, 250, end=b"1699999999999-0"), ENTRY) is None
    assert redelivery.look_threshold(_command(0, b"XPENDING", b"orders", b"workers"), ENTRY) is None   # summary
    assert redelivery.look_threshold(_command(0, b"XPENDING", b"orders", b"workers", b"IDLE", b"x", b"-", b"+",
                                              b"1"), ENTRY) is None
    assert redelivery.look_threshold(_xclaim(0, 300), ENTRY) == 300
    assert redelivery.look_threshold(_read(0, b">"), ENTRY) is None


def _block(at: float, ms: int) -> Command:
    return _command(at, b"XREADGROUP", b"GROUP", b"workers", b"c", b"BLOCK", str(ms).encode(), b"STREAMS", b"orders",
                    b">")


def test_a_consumer_that_waits_its_own_schedule_in_a_blocking_read_is_judged_on_its_gaps():
    """From the review: XPENDING IDLE 100 right after the failure, then XREADGROUP ... BLOCK until its own next
    retry (200, then 400 ms), then XPENDING and XCLAIM 100. No look passed a due entry by, but the read did wait."""
    calls = [_call(10.0, "error"), _call(10.21, "error"), _call(10.62, "ok")]
    commands = [_read(9.99, b">"), _xpending(10.005, 100), _block(10.006, 190), _xpending(10.2, 100),
                _xclaim(10.201, 100), _xpending(10.215, 100), _block(10.216, 390), _xpending(10.61, 100),
                _xclaim(10.611, 100)]
    first, second = redelivery.redeliveries(calls, commands, ENTRY)
    assert (first.eager, second.eager) == (False, False)
    assert redelivery.waits_grow(first, second)


def test_a_consumer_that_claims_when_due_but_applies_on_its_own_schedule_is_judged_on_its_gaps():
    """From the review: XAUTOCLAIM 150 takes the entry as soon as it is due; the consumer holds it until its
    200/400 ms schedule before calling apply."""
    calls = [_call(10.0, "error"), _call(10.2, "error"), _call(10.6, "ok")]
    autoclaim = lambda at: _command(at, b"XAUTOCLAIM", b"orders", b"workers", b"c", b"150", b"0-0")  # noqa: E731
    commands = [_read(9.99, b">"), autoclaim(10.05), autoclaim(10.1), autoclaim(10.151),
                autoclaim(10.25), autoclaim(10.3), autoclaim(10.351)]
    first, second = redelivery.redeliveries(calls, commands, ENTRY)
    assert not second.eager     # held 250 ms between its claim and its call
    assert redelivery.waits_grow(first, second)


def test_a_consumer_that_looks_only_as_its_wait_starts_and_sleeps_is_judged_on_its_gaps():
    calls = [_call(10.0, "error"), _call(10.21, "error"), _call(10.62, "ok")]
    commands = [_read(9.99, b">"), _xpending(10.005, 100), _xpending(10.2, 100), _xclaim(10.201, 100),
                _xpending(10.215, 100), _xpending(10.61, 100), _xclaim(10.611, 100)]
    first, second = redelivery.redeliveries(calls, commands, ENTRY)
    assert (first.eager, second.eager) == (False, False)
    assert redelivery.waits_grow(first, second)


def test_only_an_xpending_just_before_the_claim_is_the_look_that_found_the_entry():
    """An XPENDING long before the claim that found the entry due and passed it by is not taken for the trigger."""
    calls = [_call(10.0, "error"), _call(10.23, "error"), _call(10.75, "ok")]
    commands = [_read(9.99, b">"), _xpending(10.1, 200), _xpending(10.2, 200), _xclaim(10.201, 200),
                _xpending(10.33, 200), _xpending(10.45, 200), _xclaim(10.74, 200)]
    first, second = redelivery.redeliveries(calls, commands, ENTRY)
    assert (first.eager, second.eager) == (True, False)


def test_the_constant_consumer_polling_through_blocking_reads_is_still_claimed_when_due():
    """constant-min-idle's own loop: XPENDING IDLE 200, XREADGROUP BLOCK 100, again; a late second claim."""
    calls = [_call(10.0, "error"), _call(10.23, "error"), _call(10.62, "ok")]
    commands = [_read(9.99, b">"), _xpending(10.005, 200), _block(10.006, 100), _xpending(10.11, 200),
                _block(10.111, 100), _xpending(10.215, 200), _xclaim(10.216, 200),
                _xpending(10.235, 200), _block(10.236, 100), _xpending(10.34, 200), _block(10.341, 100),
                _xpending(10.6, 200), _xclaim(10.601, 200)]
    first, second = redelivery.redeliveries(calls, commands, ENTRY)
    assert (first.eager, second.eager) == (True, True)
    assert not redelivery.waits_grow(first, second)


def test_a_long_field_keeps_its_start_and_its_end():
    # a dead letter's error written as a whole traceback: the exception's text comes last
    from retrylab.checks.stream_consumer import streams
    traceback = b"Traceback (most recent call last):\n" + b"  File x\n" * 1000 + b"EffectError: order ord-1 declined"
    entry = streams.Entry(b"1-0", {b"error": streams._cut(traceback), b"order_id": b"ord-1"})
    assert entry.value("error").endswith("EffectError: order ord-1 declined") and entry.value("order_id") == "ord-1"
    assert len(entry.fields[b"error"]) < streams.MAX_FIELD_BYTES + 16 and entry.get("error").startswith("Traceback")


def test_verify_lists_a_few_field_names_of_a_dead_letter_with_thousands():
    from retrylab.checks.stream_consumer import streams, verifiers
    entry = streams.Entry(b"1-0", {f"note{i}".encode(): b"x" for i in range(20_000)})
    said = verifiers.dead_letter_problem(entry, set(), None)
    assert "note0" in said and len(said) < 2000, len(said)
