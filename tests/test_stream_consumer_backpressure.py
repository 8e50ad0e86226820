"""stream-consumer step 6 (backpressure): the reference and every corpus entry of this area get their
expected step-6 verdict on the fake and the redis-server backends (an entry's: in the full grading the
corpus test reads too, tests/gradings.py); the policy line, the shapes of
`orders:refused`, the lag near a refusal and the commands that trim `orders` are read as documented."""
from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import fakeredis
import pytest

from retrylab.brokers.redis.commands import Command
from retrylab.checks.stream_consumer import refusals, run_backpressure
from retrylab.checks.stream_consumer.test_step6_backpressure import lag_limit, lag_near, near_limit
from retrylab.fixtures.stream_consumer import corpus
from retrylab.fixtures.stream_consumer.corpus import REFERENCE
from retrylab.grading import grade

EXERCISE = "stream-consumer"
BACKENDS = ["fake", "redis-server"]
STEP = 6
# this area's entries: those whose producer.py is the only file they change (all of them, today)
ENTRIES = [e for e in corpus.entries()
           if [p.name for p in e.folder.iterdir() if p.name not in ("fixture.toml", "__pycache__")] == ["producer.py"]]


def _step6(report):
    return next(r for r in report.lab_results if r.number == STEP)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reference_passes_step_6(backend):
    report = grade(REFERENCE, backend=backend, exercise_id=EXERCISE, steps=(STEP,))
    result = _step6(report)
    assert result.status == "pass", result.message
    assert report.exit_status() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_corpus_entry_gets_its_step_6_verdict(entry, backend, shared_gradings):
    result = _step6(shared_gradings.entry(EXERCISE, entry, backend))
    assert result.status == entry.expect[STEP], f"{entry.id}: {entry.why}\n{result.message}"
    if result.status == "fail":   # a learner can act on it: says what is wrong, then the hint
        assert result.message.strip() and "Hint:" in result.message


def test_the_area_has_its_entries_with_every_step_expected():
    names = {e.id for e in ENTRIES}
    assert {"wrong/producer-ignores-lag", "wrong/maxlen-as-backpressure", "wrong/refusals-not-recorded",
            "wrong/refuse-everything", "wrong/producer-lag-from-xlen", "wrong/no-policy-line", "wrong/shed-that-blocks",
            "wrong/loses-orders-silently", "wrong/producer-paced-ignores-lag", "correct/policy-shed", "correct/policy-reject",
            "correct/block-own-lag", "correct/reject-bytes-hash"} <= names
    for entry in ENTRIES:
        assert sorted(entry.expect) == [1, 2, 3, 4, 5, 6], entry.id
        # only producer.py changes: steps 1-5 (consumer.py, lag.py) are the reference's
        assert all(entry.expect[n] == "pass" for n in range(1, 6)), entry.id


# ------------------------------------------------------------------------------------------------
# the policy line


@pytest.mark.parametrize("stdout, expected", [
    ("policy=block\nadded=5\n", ["block"]),
    ("starting\n  policy=shed max_lag=10\n", ["shed"]),
    ("policy=block\npolicy=shed\n", ["block", "shed"]),
    ("policy=\n", [""]),
    ("my policy=block\nPolicy: block\n", []),
    ("", []),
])
def test_policy_lines(stdout, expected):
    assert refusals.policy_lines(stdout) == expected


# ------------------------------------------------------------------------------------------------
# orders:refused in each shape it may take


@pytest.fixture
def client():
    return fakeredis.FakeRedis()


def test_refusals_from_a_stream(client):
    client.xadd("orders:refused", {"order_id": "a1", "reason": "shed: lag 20"})
    client.xadd("orders:refused", {"order_id": "a2"})
    found, odd = refusals.read(client)
    assert odd is None
    assert [(r.order_id, r.reason) for r in found] == [("a1", "shed: lag 20"), ("a2", None)]


def test_refusals_from_a_list_of_json_objects(client):
    client.rpush("orders:refused", json.dumps({"order_id": "b1", "reason": "full"}), json.dumps({"order_id": 7}),
                 b"not json \xff", json.dumps(["b3", "full"]))
    found, odd = refusals.read(client)
    assert odd is None
    assert [(r.order_id, r.reason) for r in found] == [("b1", "full"), ("7", None), (None, None), (None, None)]
    assert "not json" in found[2].shown


def test_refusals_from_a_hash_of_json_objects_or_plain_reasons(client):
    client.hset("orders:refused", mapping={"c1": json.dumps({"order_id": "c1", "reason": "over capacity"}),
                                           "c2": json.dumps({"reason": "over capacity"}),
                                           "c3": "too far behind"})
    found, odd = refusals.read(client)
    assert odd is None
    assert sorted((r.order_id, r.reason) for r in found) == [("c1", "over capacity"), ("c2", "over capacity"),
                                                             ("c3", "too far behind")]


def test_refusals_in_another_type_are_reported_and_a_missing_key_is_none(client):
    assert refusals.read(client) == ([], None)
    client.sadd("orders:refused", "d1")
    assert refusals.read(client) == ([], "set")


# ------------------------------------------------------------------------------------------------
# the numbers the check judges by


def test_lag_limits():
    assert lag_limit(10) == 15 and lag_limit(25) == 30 and lag_limit(50) == 60
    assert near_limit(10) == 5 and near_limit(50) == 40


def _samples(*pairs):
    return [run_backpressure.LagSample(t, lag) for t, lag in pairs]


def test_lag_near_takes_the_higher_of_the_samples_around_a_time():
    samples = _samples((0.0, 2), (0.03, 12), (0.06, 9), (0.09, 3), (1.0, 0))
    assert lag_near(samples, 0.04) == 12          # 0.03 before, 0.06 after
    assert lag_near(samples, 0.07) == 9           # 0.06 before, 0.09 after
    assert lag_near(samples, 0.5) == 3            # 0.09 before is within 0.35 s; nothing after it
    assert lag_near(samples, 3.0) == 0            # none that close: the nearest at all
    assert lag_near([], 1.0) == 0


def _command(*args, at=0.0):
    return Command(seq=1, conn=1, at=at, args=tuple(a.encode() if isinstance(a, str) else a for a in args),
                   truncated=False)


@pytest.mark.parametrize("args, trims", [
    (("XADD", "orders", "MAXLEN", "10", "*", "order_id", "a"), True),
    (("XADD", "orders", "NOMKSTREAM", "maxlen", "~", "100", "*", "order_id", "a"), True),
    (("XADD", "orders", "MINID", "0-1", "*", "order_id", "a"), True),
    (("XTRIM", "orders", "MAXLEN", "0"), True),
    (("EVAL", "redis.call('XTRIM', KEYS[1], 'MAXLEN', 5)", "1", "orders"), True),
    (("XADD", "orders", "*", "maxlen", "10"), False),              # a field that happens to be called maxlen
    (("XADD", "orders:refused", "MAXLEN", "10", "*", "order_id", "a"), False),
    (("XTRIM", "orders:dlq", "MAXLEN", "0"), False),
    (("XADD", "orders", "*", "order_id", "a"), False),
])
def test_commands_that_trim_orders(args, trims):
    assert run_backpressure._trims(_command(*args)) is trims


def test_a_refusal_is_timed_by_the_first_producer_command_naming_it():
    commands = [_command("XADD", "orders", "*", "order_id", "e1", at=1.0),
                _command("RPUSH", "orders:refused", json.dumps({"order_id": "e2", "reason": "x"}), at=2.0),
                _command("HSET", "orders:refused", "e3", "full", at=3.0),
                _command("XADD", "orders:refused", "*", "order_id", "e1", "reason", "x", at=4.0)]
    times = run_backpressure._refusal_times(commands)
    assert {i: times.get(i) for i in ("e1", "e2", "e3", "e4")} == {"e1": 4.0, "e2": 2.0, "e3": 3.0, "e4": None}


def test_a_shed_producer_that_refused_nothing_is_judged_by_the_lag_at_its_limit():
    """The decision for "claims shed, but blocks": a fail only when the samples show the lag held at M
    while it ran (a legitimate shed producer that never reached M refuses nothing and passes)."""
    from retrylab.checks.stream_consumer import test_step6_backpressure as check
    from retrylab.verdict import CheckFailed

    def run(lags):
        return SimpleNamespace(refusals=(), max_lag=10, producer_window=(0.0, 1.0),
                               samples=tuple(_samples(*((i * 0.05, lag) for i, lag in enumerate(lags)))))

    check._did_what_it_said(run([0, 5, 9, 8, 9, 7]), "shed")
    with pytest.raises(CheckFailed):
        check._did_what_it_said(run([0, 10, 10, 9, 10, 10]), "shed")


# ------------------------------------------------------------------------------------------------
# time bounds that follow the consumer's pace


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_producer_past_a_quiet_machines_bound_runs_on_while_the_consumer_applies_effects(client, monkeypatch):
    """On a busy machine the consumer drains slowly and a blocking producer rightly waits for it: past what a
    quiet machine needs, it is stopped only once the consumer has applied nothing for PRODUCER_SLACK."""
    from retrylab.checks.stream_consumer import streams
    clock = _Clock()
    monkeypatch.setattr(run_backpressure, "time", clock)
    streams.create_group(client)
    client.xadd("orders", {"order_id": "o1"})        # undelivered: the group is not drained, so never "idle"
    pace = run_backpressure.effects_with_hiccup(at=99, stall=0.5).on_call
    why: list[str] = []
    stop = run_backpressure._producer_stop(client, threading.Event(), why, pace, quiet_bound=5.0)
    progress = SimpleNamespace(started=lambda: True)
    assert stop.check(progress) is None
    for _ in range(20):                               # 10 s, twice the bound, the consumer applying now and then
        clock.now += 0.5
        pace("o1", False)
        assert stop.check(progress) is None
    clock.now += run_backpressure.PRODUCER_SLACK - 0.1
    assert stop.check(progress) is None and why == []
    clock.now += 0.2
    found = stop.check(progress)
    assert found is not None and why == ["stalled"]
    assert "consumer.py had applied nothing for the last 4 s" in found.detail


def test_a_producer_within_a_quiet_machines_bound_is_not_stopped_for_a_consumer_that_pauses(client, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(run_backpressure, "time", clock)
    from retrylab.checks.stream_consumer import streams
    streams.create_group(client)
    client.xadd("orders", {"order_id": "o1"})
    pace = run_backpressure.effects_with_hiccup(at=99, stall=0.5).on_call
    stop = run_backpressure._producer_stop(client, threading.Event(), [], pace, quiet_bound=8.0)
    progress = SimpleNamespace(started=lambda: True)
    assert stop.check(progress) is None
    clock.now += 7.9                                  # no effect at all, but within the bound
    assert stop.check(progress) is None
    assert pace.since_last(clock.now - 1.0) == 1.0    # no call yet: counted from the given start


# ------------------------------------------------------------------------------------------------
# a difference between the backends that the run works around


@pytest.mark.parametrize("backend, consumers", [("fake", 1), ("redis-server", 0)])
def test_an_empty_xreadgroup_makes_a_consumer_only_on_fakeredis(backend, consumers):
    """Measured (fakeredis 2.41, Redis 7.0.15): a first XREADGROUP that finds nothing makes the consumer
    in the group on fakeredis, not on Redis 7.0. So the run cannot wait for XINFO GROUPS' `consumers` to
    know consumer.py reads: it watches the relay for the consumer's XREADGROUP instead."""
    from retrylab.brokers.redis import make_backend
    from retrylab.checks.stream_consumer import streams

    server = make_backend(backend, redis_url=None)
    server.start()
    try:
        with server.private() as endpoint, endpoint.client() as client:
            streams.create_group(client)
            assert client.xreadgroup("workers", "c1", {"orders": ">"}, count=10, block=50) in ([], None)
            assert streams.group(client).consumers == consumers
    finally:
        server.stop()


def test_the_consumers_hiccup_is_one_long_effect_among_short_ones():
    """The stall that makes a producer ignoring the lag overrun it: EffectsApp answers the `at`-th call
    of apply with the long pause (it reads `pause` after telling on_call), every other with the short one."""
    from retrylab.appchannel import Argument

    app = run_backpressure.effects_with_hiccup(at=3, stall=0.5)
    pauses = []
    for n in range(5):
        fields = {"order_id": f"o{n}", "kind": "ok"}
        argument = Argument(text=json.dumps(fields), type_name="dict", truncated=False, decoded=True, value=fields)
        decision = app.decide("apply", (argument,))
        pauses.append(decision.value["pause"])
    assert pauses == [run_backpressure.EFFECT_PAUSE] * 2 + [0.5] + [run_backpressure.EFFECT_PAUSE] * 2


class _AcksDuringTheRange:
    """A client on which the consumer reads and acknowledges `moves` entries right after each of the first
    `times` XRANGEs: what a busy machine's delay between the harness's two commands lets happen."""

    def __init__(self, client, moves: int, times: int):
        self.client, self.moves, self.times = client, moves, times

    def __getattr__(self, name):
        return getattr(self.client, name)

    def xrange(self, *args, **kwargs):
        found = self.client.xrange(*args, **kwargs)
        if self.times > 0:
            self.times -= 1
            for _stream, entries in self.client.xreadgroup("workers", "c", {"orders": ">"}, count=self.moves):
                self.client.xack("orders", "workers", *[entry_id for entry_id, _ in entries])
        return found


def _orders_with_lag(client, added: int, read: int, acked: int):
    client.xgroup_create("orders", "workers", id="0", mkstream=True)
    for n in range(added):
        client.xadd("orders", {"n": n})
    for stream, entries in client.xreadgroup("workers", "c", {"orders": ">"}, count=read):
        for entry_id, _ in entries[:acked]:
            client.xack("orders", "workers", entry_id)


@pytest.mark.parametrize("times", [1, 2])
def test_the_group_state_is_not_counted_across_acks_made_while_it_is_read(client, times):
    """Measured in CI under load: a correct producer's lag read as 24 for --max-lag 18, six entries counted
    both pending and undelivered. Now a state that moved while it was read is read again."""
    from retrylab.checks.stream_consumer import streams
    _orders_with_lag(client, added=20, read=8, acked=2)     # lag 18: 12 undelivered + 6 pending
    state = streams.group(_AcksDuringTheRange(client, moves=6, times=times))
    # 6 more read and acknowledged during each of `times` reads: not 6 counted twice, but 6 gone each time
    assert (state.undelivered, state.pending) == (12 - 6 * times, 6)


def test_a_group_that_keeps_moving_is_counted_no_higher_than_its_lag(client):
    from retrylab.checks.stream_consumer import streams
    _orders_with_lag(client, added=40, read=8, acked=2)
    state = streams.group(_AcksDuringTheRange(client, moves=3, times=streams.SNAPSHOT_TRIES))
    true_lag = len(client.xrange("orders", b"(" + state.last_delivered, "+")) + client.xpending("orders", "workers")["pending"]
    assert state.lag == true_lag == 40 - 2 - 3 * streams.SNAPSHOT_TRIES


class _TurnedIntoAHash:
    """A client on which a learner's script makes `orders` a hash just before the harness's `nth` command (1:
    the first): what hostile/orders-wrong-type does every 50 ms while a step runs."""

    def __init__(self, client, nth: int):
        self.client, self.left = client, nth

    def __getattr__(self, name):
        command = getattr(self.client, name)

        def sent(*args, **kwargs):
            self.left -= 1
            if self.left == 0:
                self.client.delete("orders")
                self.client.hset("orders", "order_id", "not a stream")
            return command(*args, **kwargs)
        return sent


def test_a_stream_turned_into_a_hash_while_it_is_read_has_no_group_and_no_entries(client):
    """Fresh-clone CI (redis-server, under load) ended stream-consumer's step 4 in a harness error: WRONGTYPE
    from the XRANGE that followed a command saying stream. The learner broke the stream: the readers say there
    is none, and the step fails on that."""
    from retrylab.checks.stream_consumer import streams
    _orders_with_lag(client, added=5, read=2, acked=1)
    assert streams.group(_TurnedIntoAHash(client, nth=2)) is None      # after XINFO GROUPS, before XRANGE
    client.delete("orders")
    _orders_with_lag(client, added=5, read=2, acked=1)
    assert streams.group(_TurnedIntoAHash(client, nth=3)) is None      # after XRANGE, before XINFO again
    client.delete("orders")
    _orders_with_lag(client, added=5, read=2, acked=1)
    assert streams.entries(_TurnedIntoAHash(client, nth=1), "orders") == []
    assert streams.group(client) is None and streams.entries(client, "orders") == []    # a hash all along
