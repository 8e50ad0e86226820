"""The advanced checks of backoff-dlq: taskproc's failure kinds, how waits and DLQ removals are read,
and every corpus entry's advanced verdicts on both backends (its lab verdicts: test_corpus.py, which reads the
same gradings: tests/gradings.py)."""
from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from retrylab import exercise as exercises
from retrylab.appchannel import AppChannel
from retrylab.calllog import Call
from retrylab.checks.backoff_dlq import advanced
from retrylab.fixtures.backoff_dlq import corpus, taskproc
from retrylab.fixtures.backoff_dlq.taskproc_app import TaskprocApp
from retrylab.learner_site import appstub
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE
from retrylab.brokers.redis.commands import Command
from retrylab.reporters import FORMATS

EXERCISE = "backoff-dlq"
BACKENDS = ["fake", "redis-server"]
CHECKS = [a.slug for a in exercises.get().advanced]
ENTRIES = [e for e in corpus.entries() if e.expect_advanced]
DLQ = b"q:tasks:dlq"


# --------------------------------------------------------------------------------------------
# taskproc's kinds (the contract in checks/backoff_dlq/README.md, "Advanced checks")


@pytest.fixture
def taskproc_channel(tmp_path_factory, monkeypatch):
    """taskproc's stub, in this process, talking to the harness's logic over a real channel."""
    folder = tmp_path_factory.mktemp("channel")
    with AppChannel(folder / "app.sock", TaskprocApp()) as channel:
        monkeypatch.setenv(appstub.SOCKET_VARIABLE, str(channel.path))
        yield channel
        appstub.disconnect()


def _raised(kind: str, message_id: str = "c0ffee"):
    try:
        taskproc.process({"id": message_id, "kind": kind, "data": {}, "attempts": 0})
    except Exception as exc:  # noqa: BLE001 - the exception is what is tested
        return exc
    return None


@pytest.mark.parametrize("kind, cls, base, status, text", [
    ("bad", taskproc.TaskRejected, RuntimeError, None, "task c0ffee: kind=bad is rejected by taskproc"),
    ("timeout", TimeoutError, TimeoutError, None, "task c0ffee: upstream timed out"),
    ("unavailable", taskproc.HTTPError, Exception, 503, "HTTP 503 Service Unavailable for task c0ffee"),
    ("throttled", taskproc.HTTPError, Exception, 429, "HTTP 429 Too Many Requests for task c0ffee"),
    ("invalid", taskproc.SchemaViolation, ValueError, None, "task c0ffee: data does not match the task schema"),
    ("orphan", taskproc.MissingReference, LookupError, None, "task c0ffee: refers to an order that does not exist"),
])
@pytest.mark.usefixtures("taskproc_channel")
def test_each_failing_kind_raises_what_the_contract_says(kind, cls, base, status, text):
    exc = _raised(kind)
    assert type(exc) is cls and isinstance(exc, base)
    assert str(exc) == text
    if status is not None:
        assert exc.status == exc.status_code == status
    else:
        assert not hasattr(exc, "status")


@pytest.mark.usefixtures("taskproc_channel")
def test_transient_and_permanent_kinds_are_told_apart_by_type():
    assert not isinstance(_raised("unavailable"), (ValueError, LookupError, RuntimeError, TimeoutError))
    for kind in advanced.PERMANENT:
        assert isinstance(_raised(kind), (ValueError, LookupError))
    for kind in advanced.TRANSIENT:
        assert not isinstance(_raised(kind), (ValueError, LookupError))


@pytest.mark.usefixtures("taskproc_channel")
def test_good_and_unknown_kinds_succeed():
    assert _raised("good") is None and _raised("something-else") is None


@pytest.mark.usefixtures("taskproc_channel")
def test_flaky_times_out_twice_per_message_then_succeeds():
    one, other = secrets.token_hex(16), secrets.token_hex(16)
    assert [type(_raised("flaky", one)) for _ in range(4)] == [TimeoutError, TimeoutError, type(None), type(None)]
    assert type(_raised("flaky", other)) is TimeoutError  # counted per message id


def test_the_record_keeps_error_class_and_the_run_clocks_offset(taskproc_channel):
    taskproc_channel.clock.advance(6.5)
    with pytest.raises(ValueError):
        taskproc.process({"id": "abc", "kind": "invalid"})
    assert taskproc.process({"id": "def", "kind": "good"}) == {"id": "def", "status": "done"}
    calls = taskproc_channel.calls()
    assert [(c.id, c.error_class, c.offset, c.outcome) for c in calls] == [
        ("abc", "SchemaViolation", 6.5, "error"), ("def", None, 6.5 + taskproc.SECONDS_PER_CALL, "ok")]
    assert taskproc_channel.clock.offset == 6.5 + 2 * taskproc.SECONDS_PER_CALL


# --------------------------------------------------------------------------------------------
# reading waits on the virtual clock


def timeline(*events, offsets: bool = True) -> list[Call]:
    """Calls as a worker would log them. Events: ("call", id[, outcome]), ("sleep", s), ("real", s)
    (real time passing: round trips, printing, a blocking command with a timeout)."""
    real, offset, calls = 1_700_000_000.0, 0.0, []
    for event in events:
        if event[0] == "call":
            outcome = event[2] if len(event) > 2 else "error"
            calls.append(Call(t=real + offset, id=event[1], is_dict=True, arg="{}", outcome=outcome,
                              error=None if outcome == "ok" else "boom", offset=offset if offsets else None))
            offset += taskproc.SECONDS_PER_CALL
            real += 0.002
        elif event[0] == "sleep":
            offset += event[1]
        else:
            real += event[1]
    return calls


def blocking(waits, *, goods_after_first=3, noise=0.0, sleep=True):
    """A worker that sleeps `waits[k]` before requeueing its failing message "m" behind the goods."""
    events = [("call", "m")]
    for k, wait in enumerate(waits):
        events.append(("sleep" if sleep else "real", wait))
        if k == 0:
            for n in range(goods_after_first):
                events += [("real", noise), ("call", f"g{n}", "ok")]
        events += [("real", noise), ("call", "m")]
    return events


def problem_of(events, **kwargs):
    return advanced.backoff_problem(advanced.retry_waits(timeline(*events, **kwargs), "m"))


def test_jittered_capped_backoff_passes_whichever_way_attempts_are_numbered():
    assert problem_of(blocking([0.4, 1.7, 0.9, 6.2])) == ""        # within 1, 2, 4, 8
    assert problem_of(blocking([1.95, 3.9, 7.8, 15.9])) == ""      # within 2, 4, 8, 16


def test_processing_of_other_messages_is_not_counted_as_waiting():
    waits = advanced.retry_waits(timeline(*blocking([0.5, 1.5, 3.0, 6.0], goods_after_first=3)), "m")
    assert [round(w.seconds, 6) for w in waits] == [0.5, 1.5, 3.0, 6.0]
    assert [w.others for w in waits] == [3, 0, 0, 0]


def test_no_wait_fails_even_for_a_slow_noisy_worker():
    assert "without waiting" in problem_of(blocking([0, 0, 0, 0], noise=0.12))


def test_a_constant_wait_fails():
    assert "same 1.00 s" in problem_of(blocking([1.0, 1.0, 1.0, 1.0], noise=0.01))


def test_a_wait_beyond_the_capped_exponential_bound_fails():
    problem = problem_of(blocking([0.5, 1.0, 2.0, 30.0]))
    assert "after failure 4" in problem and "at most 16" in problem
    assert "after failure 1" in problem_of(blocking([10, 20, 40, 80]))


def test_real_time_waits_count_beyond_the_allowance():
    # a worker that waits by blocking on Redis with a timeout: real time, not sleep
    assert problem_of(blocking([0.6, 1.3, 2.9, 5.0], sleep=False)) == ""
    assert "without waiting" in problem_of(blocking([0.1, 0.1, 0.1, 0.1], sleep=False))


def test_a_non_blocking_worker_whose_first_wait_overlaps_other_work_passes():
    # the first wait (0.8 s) passes while three good messages are processed: 0 s observed
    events = [("call", "m"), ("call", "g0", "ok"), ("call", "g1", "ok"), ("call", "g2", "ok"),
              ("call", "m"), ("sleep", 1.2), ("call", "m"), ("sleep", 0.2), ("call", "m"), ("sleep", 5.5),
              ("call", "m")]
    waits = advanced.retry_waits(timeline(*events), "m")
    assert [round(w.seconds, 6) for w in waits] == [0.0, 1.2, 0.2, 5.5]
    assert advanced.backoff_problem(waits) == ""


def test_without_offsets_the_whole_gap_is_read_with_the_allowance():
    assert problem_of(blocking([0.4, 1.7, 0.9, 6.2]), offsets=False) == ""
    assert "without waiting" in problem_of(blocking([0, 0, 0, 0], noise=0.1), offsets=False)


def test_only_the_first_five_attempts_are_read():
    events = blocking([0.4, 1.7, 0.9, 6.2, 100.0, 100.0])
    assert len(advanced.retry_waits(timeline(*events), "m")) == 4


def test_goods_ready_behind_a_sleeping_worker_are_blocked():
    sleeping = timeline(("call", "g0", "ok"), ("call", "f1"), ("sleep", 0.7), ("call", "f2"), ("sleep", 1.1),
                        ("call", "g1", "ok"), ("call", "f1"))
    delays = advanced.blocked_goods(sleeping, [{"id": "g0"}, {"id": "g1"}, {"id": "g9"}])
    assert [(g["id"], round(d, 6)) for g, d in delays] == [("g0", 0.0), ("g1", 1.8)]
    parking = timeline(("call", "g0", "ok"), ("call", "f1"), ("real", 0.05), ("call", "f2"), ("call", "g1", "ok"),
                       ("sleep", 1.0), ("call", "f1"))
    assert max(d for _, d in advanced.blocked_goods(parking, [{"id": "g0"}, {"id": "g1"}])) <= advanced.BLOCKED


# --------------------------------------------------------------------------------------------
# commands that take entries out of the DLQ


def commands(*lines: tuple) -> list[Command]:
    return [Command(seq=n, conn=1, at=0.0, args=tuple(a if isinstance(a, bytes) else str(a).encode() for a in args),
                    truncated=False) for n, args in enumerate(lines)]


@pytest.mark.parametrize("args", [
    ("LPOP", "q:tasks:dlq"), ("RPOP", "q:tasks:dlq", "10"), ("BLPOP", "q:tasks", "q:tasks:dlq", "0"),
    ("BRPOP", "q:tasks:dlq", "1"), ("LMOVE", "q:tasks:dlq", "q:tasks", "LEFT", "RIGHT"),
    ("BLMOVE", "q:tasks:dlq", "q:tasks", "LEFT", "RIGHT", "0"), ("RPOPLPUSH", "q:tasks:dlq", "q:tasks"),
    ("BRPOPLPUSH", "q:tasks:dlq", "q:tasks", "0"), ("LREM", "q:tasks:dlq", "1", "x"),
    ("LTRIM", "q:tasks:dlq", "0", "99"), ("DEL", "q:tasks", "q:tasks:dlq"), ("UNLINK", "q:tasks:dlq"),
    ("LMPOP", "2", "q:tasks", "q:tasks:dlq", "LEFT"), ("BLMPOP", "0", "1", "q:tasks:dlq", "RIGHT"),
    ("RENAME", "q:tasks:dlq", "q:old"), ("lpop", "q:tasks:dlq"),
    ("EVAL", "return redis.call('LPOP', KEYS[1])", "1", "q:tasks:dlq"),
    ("EVAL", "local v = redis.pcall( \"rpoplpush\", 'q:tasks:dlq', 'q:tasks') return v", "0"),
])
def test_a_command_that_removes_from_the_dlq_is_found(args):
    found = advanced.dlq_removals(commands(("RPUSH", "q:tasks:dlq", "{}"), args))
    assert [c.args[0].decode().upper() for c in found] == [args[0].upper()]


@pytest.mark.parametrize("args", [
    ("RPUSH", "q:tasks:dlq", "{}"), ("LPUSH", "q:tasks:dlq", "{}"), ("LLEN", "q:tasks:dlq"),
    ("LRANGE", "q:tasks:dlq", "0", "-1"), ("LPOP", "q:tasks"), ("BLPOP", "q:tasks", "0"),
    ("LMOVE", "q:tasks", "q:tasks:dlq", "LEFT", "RIGHT"), ("DEL", "q:tasks:processing"),
    ("EVAL", "return redis.call('RPUSH', KEYS[1], ARGV[1])", "1", "q:tasks:dlq", "{}"),
    ("EVAL", "return redis.call('LPOP', KEYS[1])", "1", "q:tasks"), ("LMPOP", "1", "q:tasks", "LEFT"),
    ("LMPOP", "x", "q:tasks:dlq"),
])
def test_writing_or_reading_the_dlq_is_not_a_removal(args):
    assert advanced.dlq_removals(commands(args)) == []


def test_a_removal_queued_in_a_transaction_or_a_loaded_script_is_found():
    script = b"local n = redis.call('LLEN', KEYS[1]) redis.call('DEL', KEYS[1]) return n"
    sha = hashlib.sha1(script).hexdigest()
    found = advanced.dlq_removals(commands(("MULTI",), ("LREM", "q:tasks:dlq", "0", "x"), ("EXEC",),
                                           ("SCRIPT", "LOAD", script), ("EVALSHA", sha.upper(), "1", "q:tasks:dlq"),
                                           ("EVALSHA", "0" * 40, "1", "q:tasks:dlq")))
    assert [c.args[0] for c in found] == [b"LREM", b"EVALSHA"]


def test_dead_lettered_ids_are_read_from_pushes_to_the_dlq():
    pushed = commands(("RPUSH", "q:tasks:dlq", json.dumps({"payload": {"id": "a1"}, "error": "x"})),
                      ("LPUSH", "q:tasks:dlq", json.dumps({"id": "b2"}), "not json"),
                      ("RPUSH", "q:tasks", json.dumps({"id": "c3"})))
    assert advanced.dead_lettered_ids(pushed) == {"a1", "b2"}


# --------------------------------------------------------------------------------------------
# the corpus: every advanced check is proven both ways


def test_every_entry_with_advanced_verdicts_names_every_advanced_check():
    assert CHECKS == ["backoff-applied", "non-blocking", "error-classes", "no-auto-replay", "dlq-alert"]
    for entry in ENTRIES:
        assert sorted(entry.expect_advanced) == sorted(CHECKS), entry.id


@pytest.mark.parametrize("check", CHECKS)
def test_each_advanced_check_has_passing_and_failing_entries(check):
    failing = [e for e in ENTRIES if e.expect_advanced[check] == "fail"]
    lab_correct = [e for e in failing if set(e.expect.values()) == {"pass"}]
    assert len(failing) >= 2 and lab_correct, f"{check}: needs failing entries, one of them lab-correct"
    assert any(e.kind == "correct" and set(e.expect_advanced.values()) == {"pass"} for e in ENTRIES)
    assert all(e.kind == "wrong" for e in failing), "an entry failing an advanced check belongs in wrong/"


def _advanced(report) -> dict[str, str]:
    return {r.name.removeprefix("advanced:"): r.status for r in report.advanced_results}


def _explain(report) -> str:
    return "\n".join(f"{r.name} {r.status}: {r.message}" for r in report.results if not r.passed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_corpus_entry_gets_its_expected_advanced_verdicts(entry, backend, shared_gradings):
    report = shared_gradings.entry(EXERCISE, entry, backend)
    assert _advanced(report) == entry.expect_advanced, f"{entry.id}: {entry.why}\n{_explain(report)}"
    for result in report.advanced_results:
        assert result.number is None and result.weight == 0
        if result.status == "fail":  # says what is wrong, then the hint
            assert result.message.strip() and "Hint:" in result.message and "Traceback" not in result.message
    lab_ok = set(entry.expect.values()) == {"pass"}
    assert report.exit_status() == (0 if lab_ok else 1)  # advanced checks never change it ...
    strict = 0 if lab_ok and set(entry.expect_advanced.values()) == {"pass"} else 1
    assert report.exit_status(strict=True) == strict     # ... unless --strict asks them to


@pytest.mark.parametrize("backend", BACKENDS)
def test_reference_solution_passes_every_advanced_check(backend, shared_gradings):
    report = shared_gradings.reference(EXERCISE, REFERENCE, backend)
    assert _advanced(report) == {check: "pass" for check in CHECKS}, _explain(report)
    assert report.exit_status(strict=True) == 0


def test_reports_show_advanced_checks_apart(shared_gradings):
    entry = next(e for e in ENTRIES if e.name == "advanced-no-alert")
    report = shared_gradings.entry(EXERCISE, entry, "fake")
    text = FORMATS["text"](report)
    lab_part, advanced_part = text.split("Advanced checks", 1)
    assert "advanced:" not in lab_part and "8/8 steps pass" in advanced_part
    assert "FAIL  advanced:dlq-alert" in advanced_part and "PASS  advanced:non-blocking" in advanced_part
    results = json.loads(FORMATS["exercism"](report))
    assert results["status"] == "pass"  # the lab passed; the failed advanced check is its own test
    assert [t.get("task_id") for t in results["tests"]] == list(range(1, 9)) + [None] * len(CHECKS)
    assert [t["name"].split(":")[1] for t in results["tests"][8:]] == CHECKS
    alert = results["tests"][8 + CHECKS.index("dlq-alert")]
    assert alert["status"] == "fail" and "alert.py is missing" in alert["message"]


def test_strict_cli_fails_a_lab_correct_submission_on_an_advanced_check(tmp_path):
    entry = next(e for e in ENTRIES if e.name == "advanced-alert-always-zero")
    submission = entry.materialize(tmp_path / "submission")
    done = subprocess.run([sys.executable, "-m", "retrylab", "check", str(submission), "--strict",
                           "--format", "exercism"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    results = json.loads(done.stdout)
    by_name = {t["name"]: t for t in results["tests"]}
    alert = next(t for name, t in by_name.items() if name.startswith("advanced:dlq-alert"))
    assert alert["status"] == "fail" and "task_id" not in alert
    assert results["status"] == "pass"


# -- the advanced run, begun beside the lab steps' worker run ---------------------------------------------------------

def _processes_named(marker: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


# Step 1's time limit in the test below: long enough for the advanced run's worker to be started beside the
# lab's on a loaded machine (3 s was not, at load 11-15: the two were never seen at once)
BOTH_STARTED = 10


@pytest.mark.parametrize("backend", ["fake", "redis-server"])
def test_the_advanced_run_goes_beside_the_lab_run_and_ends_with_the_grading(backend, tmp_path):
    """Both worker runs at once; a grading that stops early (-x after step 1's time limit) stops the
    advanced run too, instead of leaving it running in a thread after pytest returns."""
    marker = f"never-settles-{secrets.token_hex(8)}"
    folder = corpus.load(corpus.SUBMISSIONS / "correct" / "envelope-format").materialize(tmp_path / "submission")
    # re-executes itself with the marker in its command line (so it can be found), then changes Redis
    # every second, so neither worker run ever settles
    (folder / "worker.py").write_text(
        f"import os, sys, redis\nif sys.argv[1:] != [{marker!r}]:\n"
        f"    os.execv(sys.executable, [sys.executable, sys.argv[0], {marker!r}])\n"
        "r = redis.Redis()\nwhile True:\n    r.rpush('tick', 1)\n    r.blpop('nothing-comes', timeout=1)\n")
    exercise = exercises.get()
    seen: set[int] = set()
    at_once = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            running = _processes_named(marker)
            seen.update(running)
            at_once.append(len(running))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        exit_code = pytest.main([str(exercise.folder), "-c", str(exercises.CHECKS_DIR / "pytest.ini"),
                                 "--rootdir", str(exercises.CHECKS_DIR), "-p", "retrylab.plugin",
                                 "-p", "no:cacheprovider", "-p", "no:randomly", "-q", "-x",
                                 "--solution", str(folder), "--backend", backend, f"--step-timeout={BOTH_STARTED}"])
        left = _processes_named(marker)
    finally:
        done.set()
        watcher.join()
    assert exit_code == pytest.ExitCode.TESTS_FAILED
    assert len(seen) == 2 and max(at_once) == 2   # the lab's worker run and the advanced one, together
    assert left == []
