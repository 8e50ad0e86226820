"""stream-consumer step 4 (idempotent): the harness's end of the learner's process (EffectsApp end_after),
the reading of the relay's commands, the crash-and-restart run of the reference, and the step 1 and 4
verdicts of the reference and of the corpus entries this step added, on both backends (an entry's: in the
full grading the corpus test reads too, tests/gradings.py)."""
from __future__ import annotations

import pytest

from retrylab.appchannel import Argument
from retrylab.brokers.redis import BROKER, make_backend
from retrylab.brokers.redis.commands import Command
from retrylab.calllog import Call
from retrylab.checks.stream_consumer import observe, redelivery
from retrylab.checks.stream_consumer.run_crash import (ORDERS, TARGET, CrashRun, acks, names, observe_crash,
                                                       reads_noack, sent_after_the_end, takes_back)
from retrylab.fixtures.stream_consumer import corpus, orders
from retrylab.fixtures.stream_consumer.effects import ENDED_STATUS, EffectError
from retrylab.fixtures.stream_consumer.effects_app import EffectsApp
from retrylab.grading import grade
from retrylab.runner import LearnerRunner, ScriptRun

BACKENDS = ["fake", "redis-server"]
EXERCISE = "stream-consumer"
ENTRIES = [e for e in corpus.entries() if e.name.startswith("idempotent-")]
# why each wrong entry fails step 4: a phrase of the English message it must get
REASONS = {
    "idempotent-no-key": "was applied 2 times",
    "idempotent-key-after-effect": "was applied 2 times",
    "idempotent-memory-set": "was applied 2 times",
    "idempotent-ack-before-effect": "was XACKed before its effect was applied",
    "idempotent-skip-without-ack": "rightly not applied again, but it was never XACKed",
    "idempotent-never-reclaims": "was never taken back",
    "idempotent-exit-hooks-ack": "still sent XACK (",
    "idempotent-exit-hook-marks-done": "still sent SET (",
    "idempotent-exit-ignored": "went on running until the harness stopped it",
    "idempotent-exit-hook-hashed-key": "still sent SET (",
    "idempotent-acks-pending-at-start": "before the restart the harness delivered it to the ended consumer",
}


# -- EffectsApp's end_after -----------------------------------------------------------------------

def _call(app: EffectsApp, fields: dict):
    return app.decide("apply", (Argument(text="", type_name="dict", truncated=False, decoded=True, value=fields),))


def test_end_after_ends_the_process_after_the_targets_first_effect_only():
    target, other = orders.batch("ok", "ok")
    app = EffectsApp(seeded=[target, other], end_after={target["order_id"]})
    assert _call(app, other).value == {"pause": 0.0, "end_process": False}
    first = _call(app, target)
    assert first.error is None and first.id == target["order_id"]
    assert first.value == {"pause": 0.0, "end_process": True}
    # the restarted consumer is left alone: a second call applies (and is counted) without ending it
    assert _call(app, target).value == {"pause": 0.0, "end_process": False}


def test_end_after_waits_for_an_effect_that_applies():
    flaky = orders.new_order("flaky")
    app = EffectsApp(seeded=[flaky], end_after={flaky["order_id"]})
    for _ in range(2):   # a failed call applies nothing: there is no effect to end the process after
        decision = _call(app, flaky)
        assert isinstance(decision.error, EffectError) and decision.value is None
    assert _call(app, flaky).value["end_process"] is True


# -- what the relay's commands say ----------------------------------------------------------------

def _cmd(*args: str | bytes) -> Command:
    raw = tuple(a if isinstance(a, bytes) else a.encode() for a in args)
    return Command(seq=0, conn=1, at=0.0, args=raw, truncated=False)


ENTRY, OWNER = b"1700000000000-1", b"host-42"


@pytest.mark.parametrize("command, ids", [
    (_cmd("XREADGROUP", "GROUP", "workers", "c", "COUNT", "10", "BLOCK", "100", "STREAMS", "orders", ">"), [b">"]),
    (_cmd("xreadgroup", "group", "workers", "c", "streams", "orders", "dlq", "0", ">"), [b"0", b">"]),
    (_cmd("XREADGROUP", "GROUP", "workers", "streams", "STREAMS", "orders", "0"), [b"0"]),  # a consumer named so
    (_cmd("XREADGROUP", "GROUP", "workers", "c", "STREAMS", "orders"), []),                  # malformed: no id
    (_cmd("XREAD", "STREAMS", "orders", "0"), []),
])
def test_stream_ids_are_read_after_streams(command, ids):
    assert [entry_id for _, entry_id in redelivery.read_from(command)] == ids


@pytest.mark.parametrize("command, expected", [
    (_cmd("XCLAIM", "orders", "workers", "me", "200", ENTRY), True),
    (_cmd("XCLAIM", "orders", "workers", "me", "200", b"1700000000000-2", "JUSTID"), False),   # another entry
    (_cmd("XAUTOCLAIM", "orders", "workers", "me", "200", "0-0", "COUNT", "10"), True),
    (_cmd("XREADGROUP", "GROUP", "workers", OWNER, "STREAMS", "orders", "0"), True),   # its own pending list
    (_cmd("XREADGROUP", "GROUP", "workers", "someone-else", "STREAMS", "orders", "0"), False),
    (_cmd("XREADGROUP", "GROUP", "workers", OWNER, "STREAMS", "orders", ">"), False),  # only new entries
    (_cmd("XPENDING", "orders", "workers", "-", "+", "10"), False),
    (_cmd("XCLAIM", "other", "workers", "me", "200", ENTRY), False),                   # another stream's entry
    (_cmd("XAUTOCLAIM", "other", "workers", "me", "200", "0-0"), False),
    (_cmd("XREADGROUP", "GROUP", "workers", OWNER, "STREAMS", "other", "0"), False),
    (_cmd("XREADGROUP", "GROUP", "workers", OWNER, "STREAMS", "other", "orders", ">", "0"), True),
])
def test_takes_back_knows_what_redelivers_the_entry(command, expected):
    assert takes_back(command, ENTRY, OWNER) is expected


def test_acks_noack_and_names():
    assert acks(_cmd("XACK", "orders", "workers", b"1-0", ENTRY), ENTRY)
    assert not acks(_cmd("XACK", "orders", "workers", b"1-0"), ENTRY)
    assert not acks(_cmd("XADD", "orders", "*", "source_id", ENTRY), ENTRY)
    assert reads_noack(_cmd("XREADGROUP", "GROUP", "workers", "c", "NOACK", "STREAMS", "orders", ">"))
    assert not reads_noack(_cmd("XREADGROUP", "GROUP", "workers", "noack", "STREAMS", "orders", ">"))
    assert names(_cmd("SET", "orders:done:ord-1", ENTRY, "NX"), ENTRY, b"ord-1")
    assert names(_cmd("SADD", "orders:applied", "ord-1"), ENTRY, b"ord-1")
    assert not names(_cmd("SET", "orders:done:ord-2", "x"), ENTRY, b"ord-1")
    assert not names(_cmd("ord-1"), ENTRY, b"ord-1")   # the command's name is not an argument


def _crash_with(commands) -> CrashRun:
    """A first run whose target's effect was applied at t=10.0, having sent `commands(entry, order)`: the
    target's entry id and order id -> [(at, conn, args)]."""
    seeded = orders.batch(*["ok"] * ORDERS)
    ids = tuple(f"1700000000000-{n}".encode() for n in range(ORDERS))
    target = seeded[TARGET]
    effect = Call(t=10.0, id=target["order_id"], is_dict=True, arg="{}", outcome="ok", error=None, fn="apply")
    sent = tuple(Command(seq=n, conn=conn, at=at, args=tuple(a.encode() for a in args), truncated=False)
                 for n, (at, conn, args) in enumerate(commands(ids[TARGET].decode(), target["order_id"])))
    first = ScriptRun(result=None, calls=(effect,), commands=sent)
    return CrashRun(seeded=tuple(seeded), target=target, seeded_ids=ids, first=first, after_crash=(),
                    handed=None, second=None, at_end=(), group=None)


def test_nothing_sent_after_the_end_is_what_a_crash_looks_like():
    crash = _crash_with(lambda entry, order: [
        (9.0, 1, ("XREADGROUP", "GROUP", "workers", "c", "STREAMS", "orders", ">")),
        (9.5, 1, ("SET", f"orders:done:{order}", "1", "NX"))])
    assert sent_after_the_end(crash) is None


@pytest.mark.parametrize("late", [lambda entry, order: ("XACK", "orders", "workers", entry),
                                  lambda entry, order: ("SET", f"orders:done:{order}", "1")], ids=["xack", "key"])
def test_a_command_naming_the_target_after_the_end_counts_on_any_connection(late):
    crash = _crash_with(lambda entry, order: [(9.0, 1, ("PING",)), (9.1, 2, ("PING",)),
                                              (10.0004, 3, late(entry, order))])
    assert sent_after_the_end(crash) is crash.first.commands[-1]


def test_on_one_connection_a_new_command_after_the_end_counts_and_a_repeated_one_does_not():
    heartbeat = ("SET", "consumers:c:alive", "1700.1", "EX", "5")
    new_key = _crash_with(lambda entry, order: [(9.0, 1, heartbeat), (10.001, 1, ("SET", "d:5f1e0c", "1"))])
    assert sent_after_the_end(new_key).args[1] == b"d:5f1e0c"
    repeated = _crash_with(lambda entry, order: [(9.0, 1, heartbeat),
                                                 (10.001, 1, ("SET", "consumers:c:alive", "1700.2", "EX", "5"))])
    assert sent_after_the_end(repeated) is None
    # two connections before the effect: another thread may have been at work, only the target counts
    threaded = _crash_with(lambda entry, order: [(9.0, 1, heartbeat), (9.1, 2, ("PING",)),
                                                 (10.001, 1, ("SET", "d:5f1e0c", "1"))])
    assert sent_after_the_end(threaded) is None


# -- the reference's crash and restart, observed directly -----------------------------------------

@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    made = make_backend(request.param)
    made.start()
    yield made
    made.stop()


def test_reference_is_ended_at_the_target_and_restarted_without_a_second_effect(backend):
    runner = LearnerRunner(corpus.REFERENCE, learner_imports=BROKER.learner_imports)
    crash = observe_crash(runner, backend)
    assert crash.first.result.returncode == ENDED_STATUS, observe.how_it_ran(crash.first)
    assert crash.ended_at_target()
    left = crash.target_pending(crash.after_crash)
    assert left is not None and left.deliveries == 1, crash.after_crash
    assert observe.effects(crash.first)[crash.target_id] == 1
    assert crash.second is not None and crash.second.result.reason == "done_waited", observe.how_it_ran(crash.second)
    # the reference reclaims by idle time with XCLAIM (its name, host-pid, may well be the same again: the
    # sandbox gives each run its own PID namespace)
    assert any(takes_back(c, crash.target_entry, left.consumer) for c in crash.second.commands)
    assert observe.effects(crash.second)[crash.target_id] == 0
    assert crash.effects() == {o["order_id"]: 1 for o in crash.seeded} and len(crash.seeded) == ORDERS, crash.effects()
    assert crash.handed is None   # it had read every entry before it was ended: all of them were pending
    assert crash.at_end == () and crash.group.undelivered == 0, (crash.at_end, crash.group)


# -- verdicts through the grading -----------------------------------------------------------------

def _explain(report) -> str:
    return "\n".join(f"step {r.number} {r.status}: {r.message}" for r in report.lab_results)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_reference_passes_steps_1_and_4(backend_name):
    report = grade(corpus.REFERENCE, backend=backend_name, steps=(1, 4), exercise_id=EXERCISE)
    assert {r.number: r.status for r in report.lab_results} == {1: "pass", 4: "pass"}, _explain(report)


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_corpus_entry_gets_its_step_1_and_4_verdicts(entry, backend_name, shared_gradings):
    report = shared_gradings.entry(EXERCISE, entry, backend_name)
    verdicts = {r.number: r.status for r in report.lab_results if r.number in (1, 4)}
    assert verdicts == {1: entry.expect[1], 4: entry.expect[4]}, f"{entry.id}: {entry.why}\n{_explain(report)}"
    step4 = next(r for r in report.lab_results if r.number == 4)
    if step4.status == "fail":
        assert REASONS[entry.name] in step4.message and "Hint:" in step4.message, step4.message


def test_every_wrong_entry_of_this_step_has_its_reason_and_fails_step_4():
    wrong = {e.name for e in ENTRIES if e.kind == "wrong"}
    assert wrong == set(REASONS)
    assert all(e.expect[4] == "fail" for e in ENTRIES if e.kind == "wrong")
    assert all(set(e.expect.values()) == {"pass"} and set(e.expect) == set(range(1, 7))
               for e in ENTRIES if e.kind == "correct")


def test_a_first_run_past_its_target_is_not_done_while_its_process_is_ready_to_run():
    """On a busy machine a process ended by the effect can wait seconds for a CPU to exit: while a thread of it is
    ready to run it is not taken for one that went on (step 4's "went on running"); once none is, it is."""
    from types import SimpleNamespace

    from retrylab.checks.stream_consumer import run_crash

    target = "ord-1"
    applied = Call(t=10.0, id=target, is_dict=True, arg="{}", outcome="ok", error=None, fn="apply")
    running = [True]
    progress = SimpleNamespace(calls=lambda: [applied], running=lambda: running[0])
    done = run_crash._first_done(target)
    assert done(progress) is False
    running[0] = False
    assert done(progress) is True
