"""The reference solution's package (solution/backoff-dlq/retryqueue), unit by unit, on both backends.

What the lab steps cannot see is proven here: backoff pieces, error classification, DLQ record
fields, replay's options, recovery of a dead worker's in-flight messages, and a SIGTERM that
lets the message in hand finish. Redis-touching tests run on a private redis-server and on the
fake server alike.
"""
from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from retrylab.checks.backoff_dlq import artifacts
from retrylab.brokers.redis.fakeredis_fixes import start_fake_server, stop_fake_server
from retrylab.solution.backoff_dlq.retryqueue import backoff, dlq, errors, keys, messages, monitor, reliable
from retrylab.solution.backoff_dlq.retryqueue import replay as replaying
from retrylab.solution.backoff_dlq.retryqueue.delayed import DelayedRetries
from retrylab.solution.backoff_dlq.retryqueue.worker import Settings, Worker

SOLUTION = Path(__file__).resolve().parent.parent / "solution" / "backoff-dlq"
FAST = Settings(idle_block=0.05, max_nap=0.01, promote_every=0.01)


# -- backends ------------------------------------------------------------------------------------

@pytest.fixture(params=["fake", "redis-server"])
def endpoint(request):
    """A private, empty Redis: a fresh fake server, or the session's redis-server emptied."""
    if request.param == "fake":
        server = start_fake_server()
        try:
            yield {"host": "127.0.0.1", "port": server.port, "url": f"redis://127.0.0.1:{server.port}/0"}
        finally:
            stop_fake_server(server)
    else:
        server = request.getfixturevalue("private_redis_server")
        with server.client() as client:
            client.client_kill_filter(_type="normal", skipme=True)
            client.flushall()
            client.script_flush()
        yield {"host": server.host, "port": server.port, "url": server.url}


@pytest.fixture
def r(endpoint):
    client = redis.Redis(host=endpoint["host"], port=endpoint["port"], socket_timeout=10)
    yield client
    client.close()


def message(kind="good", **extra):
    msg = {"id": f"{kind}-{secrets.token_hex(8)}", "kind": kind, "data": {"n": 1}, "attempts": 0}
    return {**msg, **extra}


def enqueue(r, *msgs):
    r.rpush(keys.QUEUE, *(json.dumps(m) for m in msgs))


def dlq_entries(r):
    return [json.loads(raw) for raw in r.lrange(keys.DLQ, 0, -1)]


def run_until(worker, done, timeout=30.0):
    """Run `worker` in a thread until `done()` holds, then stop it; the worker must stop by itself."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not done():
            assert thread.is_alive(), "the worker stopped on its own"
            assert time.monotonic() < deadline, "the worker did not get there"
            time.sleep(0.01)
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive(), "the worker did not stop after stop()"


def settled(r, dead):
    def done():
        in_flight = sum(r.llen(k) for k in r.keys(b"q:tasks:processing:*"))
        return (r.llen(keys.QUEUE) == 0 and r.zcard(keys.DELAYED) == 0 and in_flight == 0
                and r.llen(keys.DLQ) == dead)
    return done


# -- backoff ---------------------------------------------------------------------------------------

def test_exponential_doubles_from_the_base():
    assert [backoff.exponential(1.0)(n) for n in range(6)] == [1, 2, 4, 8, 16, 32]
    assert [backoff.exponential(0.5)(n) for n in range(3)] == [0.5, 1, 2]


def test_capped_stops_growing_at_the_cap():
    assert [backoff.capped(backoff.exponential(1.0), 30.0)(n) for n in range(9)] == [1, 2, 4, 8, 16, 30, 30, 30, 30]


def test_full_jitter_draws_anywhere_below_the_capped_wait():
    strategy = backoff.full_jitter(backoff.capped(backoff.exponential(1.0), 30.0), rng=random.Random(7))
    draws = [strategy(3) for _ in range(200)]
    assert all(0 <= d <= 8 for d in draws)
    assert len(set(draws)) == 200
    assert min(draws) < 1 and max(draws) > 7  # the whole range is used, not a band
    assert all(0 <= strategy(10) <= 30 for _ in range(200))


def test_policy_is_full_jitter_over_capped_exponential():
    composed = backoff.full_jitter(backoff.capped(backoff.exponential(2.0), 10.0), rng=random.Random(1))
    policy = backoff.policy(2.0, 10.0)
    random.seed(1)
    assert [policy(n) for n in range(6)] == [composed(n) for n in range(6)]


# -- classification ------------------------------------------------------------------------------

class HTTPError(Exception):
    def __init__(self, status, attribute="status"):
        super().__init__(f"HTTP {status} for task x")
        setattr(self, attribute, status)


class SchemaViolation(ValueError):
    pass


class MissingReference(LookupError):
    pass


@pytest.mark.parametrize("exc, expected", [
    (TimeoutError("upstream timed out"), errors.RETRYABLE),
    (ConnectionResetError("reset"), errors.RETRYABLE),
    (HTTPError(503), errors.RETRYABLE),
    (HTTPError(429), errors.RETRYABLE),
    (HTTPError(503, "status_code"), errors.RETRYABLE),
    (HTTPError(502), errors.RETRYABLE),
    (HTTPError(404), errors.PERMANENT),
    (HTTPError(422, "status_code"), errors.PERMANENT),
    (SchemaViolation("field order is missing"), errors.PERMANENT),
    (MissingReference("customer 7 does not exist"), errors.PERMANENT),
    (KeyError("sku"), errors.PERMANENT),
    (json.JSONDecodeError("bad", "{", 0), errors.PERMANENT),
    (RuntimeError("kind=bad is rejected"), errors.RETRYABLE),   # unknown: retried
    (Exception(), errors.RETRYABLE),
])
def test_classify(exc, expected):
    assert errors.classify(exc) == expected


def test_an_http_status_beats_the_exception_type():
    class ServiceDown(ValueError):
        status = 503
    assert errors.classify(ServiceDown("down")) == errors.RETRYABLE


def test_a_boolean_is_not_a_status():
    class Odd(ValueError):
        status = True
    assert errors.status_of(Odd()) is None
    assert errors.classify(Odd()) == errors.PERMANENT


def test_describe_keeps_type_and_text():
    assert errors.describe(TimeoutError("task 1: upstream timed out")) == "TimeoutError: task 1: upstream timed out"
    assert errors.describe(KeyError()) == "KeyError"


# -- messages --------------------------------------------------------------------------------------

def test_after_failure_counts_and_keeps_the_first_seen_time():
    msg = message("bad")
    once = messages.after_failure(msg, 1000.0)
    twice = messages.after_failure(once, 2000.0)
    assert (once["attempts"], once["first_seen_at"]) == (1, 1000.0)
    assert (twice["attempts"], twice["first_seen_at"]) == (2, 1000.0)
    assert messages.original(twice) == {k: v for k, v in msg.items() if k != "attempts"}


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'"text"', b"\xff\xfe"])
def test_decode_rejects_what_is_not_a_json_object(raw):
    with pytest.raises(messages.Malformed):
        messages.decode(raw)


@pytest.mark.parametrize("value, expected", [(3, 3), ("3", 0), (-1, 0), (True, 0), (None, 0)])
def test_attempts_of_a_message_with_no_or_a_bad_count_is_zero(value, expected):
    assert messages.attempts({"attempts": value}) == expected


# -- DLQ records ---------------------------------------------------------------------------------

def _raised(exc):
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001
        return caught


def test_dlq_record_has_the_lab_keys_and_the_investigation_keys():
    exc = _raised(SchemaViolation("task 9: field order is missing"))
    entry = dlq.record({"id": "9"}, exc, attempts=1, first_seen_at=10.0, failed_at=11.5, worker_id="w1")
    assert entry["payload"] == {"id": "9"}
    assert entry["error"] == "SchemaViolation: task 9: field order is missing"
    assert (entry["attempts"], entry["first_seen_at"], entry["last_failed_at"]) == (1, 10.0, 11.5)
    assert entry["error_class"] == errors.PERMANENT
    assert entry["exception"].endswith("SchemaViolation")
    assert "field order is missing" in entry["traceback"] and entry["worker"] == "w1"
    json.dumps(entry)  # stored as JSON


def test_dlq_record_keeps_the_end_of_a_long_traceback():
    exc = _raised(TimeoutError("upstream said: " + "x" * 3 * dlq.TRACEBACK_LIMIT + " (the end)"))
    entry = dlq.record({}, exc, attempts=5, first_seen_at=0, failed_at=0, worker_id="w")
    assert len(entry["traceback"]) <= dlq.TRACEBACK_LIMIT + 3
    assert entry["traceback"].startswith("...")
    assert entry["traceback"].rstrip().endswith("(the end)")


@pytest.mark.parametrize("raw, problem", [
    (b"not json", "not a JSON object"),
    (b'{"payload": "text", "error": "x"}', "its payload is not a message object"),
])
def test_an_entry_that_cannot_be_replayed_says_why(raw, problem):
    assert dlq.to_message(raw) == (None, problem)


def test_a_replayed_message_starts_its_retries_over():
    raw = json.dumps({"payload": {"id": "a", "kind": "bad", "first_seen_at": 5, "attempts": 4}, "attempts": 5})
    assert dlq.to_message(raw) == ({"id": "a", "kind": "bad", "attempts": 0}, None)


# -- the worker against Redis ----------------------------------------------------------------------

class TaskApp:
    """A stand-in for taskproc with the contract's kinds; records every call."""

    def __init__(self):
        self.calls = []
        self.flaky = {}

    def process(self, msg):
        self.calls.append(msg["id"])
        kind = msg["kind"]
        if kind == "bad":
            raise RuntimeError(f"task {msg['id']}: kind=bad is rejected by taskproc")
        if kind == "timeout":
            raise TimeoutError(f"task {msg['id']}: upstream timed out")
        if kind in ("unavailable", "throttled"):
            raise HTTPError(503 if kind == "unavailable" else 429)
        if kind == "invalid":
            raise SchemaViolation(f"task {msg['id']}: field order is missing")
        if kind == "orphan":
            raise MissingReference(f"task {msg['id']}: customer does not exist")
        if kind == "flaky":
            self.flaky[msg["id"]] = self.flaky.get(msg["id"], 0) + 1
            if self.flaky[msg["id"]] <= 2:
                raise TimeoutError(f"task {msg['id']}: upstream timed out")

    def count(self, msg):
        return self.calls.count(msg["id"])


def test_transient_errors_are_retried_permanent_ones_are_not(r):
    app = TaskApp()
    transient = [message(k) for k in ("bad", "timeout", "unavailable", "throttled")]
    permanent = [message(k) for k in ("invalid", "orphan")]
    flaky, goods = message("flaky"), [message() for _ in range(3)]
    enqueue(r, goods[0], *transient, flaky, goods[1], *permanent, goods[2])
    worker = Worker(r, app.process, FAST, policy=lambda attempt: 0.0)
    run_until(worker, settled(r, dead=6))

    assert [app.count(m) for m in transient] == [5, 5, 5, 5]
    assert [app.count(m) for m in permanent] == [1, 1]
    assert app.count(flaky) == 3 and [app.count(g) for g in goods] == [1, 1, 1]
    entries = {e["payload"]["id"]: e for e in dlq_entries(r)}
    assert set(entries) == {m["id"] for m in transient + permanent}
    for m in transient:
        assert (entries[m["id"]]["attempts"], entries[m["id"]]["error_class"]) == (5, errors.RETRYABLE)
    for m in permanent:
        entry = entries[m["id"]]
        assert (entry["attempts"], entry["error_class"]) == (1, errors.PERMANENT)
        assert m["id"] in entry["error"]  # the exception's text, reason recorded


def test_dlq_entry_after_five_failures(r):
    app = TaskApp()
    bad = message("bad")
    enqueue(r, bad)
    before = time.time()
    worker = Worker(r, app.process, FAST, worker_id="test-worker", policy=lambda attempt: 0.01)
    run_until(worker, settled(r, dead=1))
    [entry] = dlq_entries(r)
    assert entry["payload"] == {k: v for k, v in bad.items() if k != "attempts"}
    assert entry["attempts"] == 5 and f"task {bad['id']}: kind=bad is rejected" in entry["error"]
    assert before <= entry["first_seen_at"] <= entry["last_failed_at"] <= time.time()
    assert entry["last_failed_at"] - entry["first_seen_at"] >= 4 * 0.01  # four waits in between
    assert entry["worker"] == "test-worker" and entry["exception"].endswith("RuntimeError")
    assert "Traceback" in entry["traceback"]


def test_good_messages_do_not_wait_behind_a_retry(r):
    app = TaskApp()
    bad, goods = message("bad"), [message() for _ in range(5)]
    enqueue(r, bad, *goods)
    worker = Worker(r, app.process, FAST, policy=lambda attempt: 3600.0)  # an hour: only non-blocking passes
    run_until(worker, lambda: all(app.count(g) == 1 for g in goods) and r.zcard(keys.DELAYED) == 1)
    [(parked, due)] = r.zrange(keys.DELAYED, 0, -1, withscores=True)
    assert json.loads(parked)["attempts"] == 1 and due > time.time() + 3000
    assert app.count(bad) == 1


def test_a_malformed_message_goes_straight_to_the_dlq(r):
    r.rpush(keys.QUEUE, b"{not json", b"\xff")
    app = TaskApp()
    run_until(Worker(r, app.process, FAST), settled(r, dead=2))
    assert app.calls == []
    assert {e["payload"] for e in dlq_entries(r)} == {"{not json", "\ufffd"}
    assert all(e["error_class"] == errors.PERMANENT and e["attempts"] == 1 for e in dlq_entries(r))


def test_the_worker_never_takes_anything_out_of_the_dlq(r):
    r.rpush(keys.DLQ, json.dumps({"payload": message("bad"), "error": "x", "attempts": 5, "first_seen_at": 1}))
    app = TaskApp()
    enqueue(r, message())
    run_until(Worker(r, app.process, FAST), settled(r, dead=1))
    assert len(app.calls) == 1 and r.llen(keys.DLQ) == 1


# -- reliable fetch and recovery ---------------------------------------------------------------------

def test_take_acknowledges_the_last_message_and_takes_the_next_in_one_step(r):
    enqueue(r, message(), message())
    fetch = reliable.ReliableFetch(r, "w1")
    first = fetch.take()
    assert r.lrange(fetch.processing, 0, -1) == [first]
    second = fetch.take(ack=first)
    assert r.lrange(fetch.processing, 0, -1) == [second] and r.llen(keys.QUEUE) == 0
    assert fetch.take(ack=second) is None and r.llen(fetch.processing) == 0


def test_park_and_promote_move_a_retry_atomically(r):
    enqueue(r, message("bad"))
    fetch, delayed = reliable.ReliableFetch(r, "w1"), DelayedRetries(r)
    raw = fetch.take()
    delayed.park(fetch.processing, raw, "retry-1", due=100.0)
    delayed.park(fetch.processing, b"", "retry-2", due=200.0)
    assert r.llen(fetch.processing) == 0 and r.zcard(keys.DELAYED) == 2
    assert delayed.promote(now=50.0) == (0, 100.0)
    assert delayed.promote(now=150.0) == (1, 200.0)
    assert r.lrange(keys.QUEUE, 0, -1) == [b"retry-1"]
    assert delayed.promote(now=250.0) == (1, None)


def test_a_dead_workers_in_flight_messages_go_back_to_the_head_of_the_queue(r):
    queued, held = message(), [message(), message()]
    enqueue(r, queued)
    r.rpush(keys.processing("dead-1"), *(json.dumps(m) for m in held))
    r.sadd(keys.WORKERS, "dead-1", "alive-1")  # dead-1's heartbeat expired; alive-1's has not
    r.set(keys.heartbeat("alive-1"), "alive-1", px=60_000)
    r.rpush(keys.processing("alive-1"), json.dumps(message()))
    logged = []
    assert reliable.recover_dead_workers(r, log=logged.append) == 2
    assert [json.loads(m)["id"] for m in r.lrange(keys.QUEUE, 0, -1)] == [held[0]["id"], held[1]["id"], queued["id"]]
    assert r.llen(keys.processing("dead-1")) == 0 and r.llen(keys.processing("alive-1")) == 1
    assert {w.decode() for w in r.smembers(keys.WORKERS)} == {"alive-1"}
    assert "dead-1" in logged[0]


def test_a_starting_worker_recovers_and_processes_a_dead_workers_messages(r):
    held = message()
    r.rpush(keys.processing("crashed"), json.dumps(held))
    r.sadd(keys.WORKERS, "crashed")
    app = TaskApp()
    run_until(Worker(r, app.process, FAST), lambda: app.count(held) == 1 and not r.exists(keys.processing("crashed")))
    assert not r.sismember(keys.WORKERS, "crashed")


def test_a_stopped_worker_leaves_no_trace_but_its_unfinished_messages(r):
    fetch = reliable.ReliableFetch(r, "w1")
    fetch.beat()
    enqueue(r, message(), message())
    taken = fetch.take()  # taken, never processed
    assert fetch.retire() == 1
    assert r.lindex(keys.QUEUE, 0) == taken and r.llen(keys.QUEUE) == 2
    assert not r.exists(keys.heartbeat("w1")) and not r.sismember(keys.WORKERS, "w1")


# -- SIGTERM ---------------------------------------------------------------------------------------

SLOW_TASKPROC = """
import os, time
def process(msg):
    with open(os.environ["MARKS"], "a") as f:
        f.write("started " + msg["id"] + "\\n")
    time.sleep(1.0)
    with open(os.environ["MARKS"], "a") as f:
        f.write("finished " + msg["id"] + "\\n")
"""


def start_worker_script(endpoint, tmp_path, **env):
    (tmp_path / "taskproc.py").write_text(SLOW_TASKPROC)
    environ = {"PATH": os.environ.get("PATH", ""), "REDIS_URL": endpoint["url"], "PYTHONPATH": str(tmp_path),
               "MARKS": str(tmp_path / "marks.txt"), **env}
    return subprocess.Popen([sys.executable, str(SOLUTION / "worker.py")], env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_for(condition, proc, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"worker exited or stalled: {proc.communicate()[0].decode()[-2000:]}")
        time.sleep(0.01)


def test_sigterm_finishes_the_message_in_hand_then_exits(r, endpoint, tmp_path):
    first, second = message(), message()
    enqueue(r, first, second)
    proc = start_worker_script(endpoint, tmp_path)
    marks = tmp_path / "marks.txt"
    wait_for(lambda: marks.exists() and "started" in marks.read_text(), proc)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=20)[0].decode()
    assert proc.returncode == 0, output
    assert marks.read_text().split("\n")[:2] == [f"started {first['id']}", f"finished {first['id']}"]
    assert second["id"] not in marks.read_text()
    assert [json.loads(m)["id"] for m in r.lrange(keys.QUEUE, 0, -1)] == [second["id"]]
    assert not r.keys(b"q:tasks:processing:*") and not r.exists(keys.WORKERS)
    assert not r.keys(b"q:tasks:heartbeat:*")


def test_sigterm_while_idle_exits_at_once_and_cleanly(r, endpoint, tmp_path):
    proc = start_worker_script(endpoint, tmp_path)
    wait_for(lambda: r.scard(keys.WORKERS) == 1, proc)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=20)[0].decode()
    assert proc.returncode == 0 and "stopped" in output, output
    assert not r.exists(keys.WORKERS) and not r.keys(b"q:tasks:heartbeat:*")


# -- replay ------------------------------------------------------------------------------------------

def dead_letter(r, msg, error):
    entry = {"payload": {k: v for k, v in msg.items() if k != "attempts"}, "error": error, "attempts": 5,
             "first_seen_at": 1.0}
    r.rpush(keys.DLQ, json.dumps(entry))
    return entry


def run_script(endpoint, script, *args):
    env = {"PATH": os.environ.get("PATH", ""), "REDIS_URL": endpoint["url"]}
    done = subprocess.run([sys.executable, str(SOLUTION / script), *args], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def three_dead(r):
    msgs = [message("bad"), message("timeout"), message("invalid")]
    for m, error in zip(msgs, ["RuntimeError: rejected", "TimeoutError: upstream timed out", "SchemaViolation: order"]):
        dead_letter(r, m, error)
    return msgs


def queued_ids(r):
    return [json.loads(m)["id"] for m in r.lrange(keys.QUEUE, 0, -1)]


def test_replay_moves_every_entry_back_with_attempts_zero(r, endpoint, three_dead):
    status, output = run_script(endpoint, "replay.py")
    assert status == 0, output
    assert queued_ids(r) == [m["id"] for m in three_dead] and r.llen(keys.DLQ) == 0
    assert all(json.loads(m)["attempts"] == 0 for m in r.lrange(keys.QUEUE, 0, -1))
    assert "moved 3; 0 left" in output


def test_replay_dry_run_moves_nothing(r, endpoint, three_dead):
    status, output = run_script(endpoint, "replay.py", "--dry-run")
    assert status == 0 and output.count("would replay") == 3, output
    assert r.llen(keys.DLQ) == 3 and not r.exists(keys.QUEUE)


def test_replay_by_id(r, endpoint, three_dead):
    status, output = run_script(endpoint, "replay.py", "--id", three_dead[1]["id"])
    assert status == 0, output
    assert queued_ids(r) == [three_dead[1]["id"]]
    assert [e["payload"]["id"] for e in dlq_entries(r)] == [three_dead[0]["id"], three_dead[2]["id"]]


def test_replay_by_matching_text(r, endpoint, three_dead):
    status, output = run_script(endpoint, "replay.py", "--match", "TimeoutError")
    assert status == 0 and queued_ids(r) == [three_dead[1]["id"]], output


def test_replay_with_a_limit(r, endpoint, three_dead):
    status, output = run_script(endpoint, "replay.py", "--limit", "2")
    assert status == 0 and queued_ids(r) == [three_dead[0]["id"], three_dead[1]["id"]], output
    assert r.llen(keys.DLQ) == 1


def test_replay_leaves_what_it_cannot_replay_and_says_so(r, three_dead):
    r.lpush(keys.DLQ, b"not json at all")
    outcomes = list(replaying.replay(r))
    assert [o.moved for o in outcomes] == [False, True, True, True]
    assert outcomes[0].problem == "not a JSON object"
    assert r.lrange(keys.DLQ, 0, -1) == [b"not json at all"]


def test_replay_of_an_entry_already_taken_pushes_nothing(r, three_dead, monkeypatch):
    entries = replaying.snapshot(r)
    r.lrem(keys.DLQ, 1, entries[0])  # another operator replayed it meanwhile ...
    monkeypatch.setattr(replaying, "snapshot", lambda client: entries)  # ... after this run looked
    outcomes = list(replaying.replay(r))
    assert [o.moved for o in outcomes] == [False, True, True]
    assert queued_ids(r) == [three_dead[1]["id"], three_dead[2]["id"]]


# -- alert and status ----------------------------------------------------------------------------

def test_alert_exits_zero_on_an_empty_dlq_and_one_above_the_threshold(r, endpoint):
    status, output = run_script(endpoint, "alert.py")
    assert status == 0 and "depth=0" in output, output
    for _ in range(3):
        dead_letter(r, message("bad"), "x")
    status, output = run_script(endpoint, "alert.py")
    assert status == 1 and "depth=3" in output, output
    status, output = run_script(endpoint, "alert.py", "--threshold", "3")
    assert status == 0 and "depth=3" in output, output


def test_status_reports_depths_and_ages(r, endpoint):
    now = time.time()
    enqueue(r, message("bad", attempts=2, first_seen_at=now - 60), message())
    r.zadd(keys.DELAYED, {json.dumps(message("bad")): now - 5})
    r.rpush(keys.DLQ, json.dumps({"payload": message(), "error": "x", "attempts": 5,
                                  "first_seen_at": now - 7200, "last_failed_at": now - 3600}))
    r.sadd(keys.WORKERS, "w1")
    r.rpush(keys.processing("w1"), "in flight")
    depths = monitor.measure(r, now=now)
    assert (depths.queued, depths.delayed, depths.in_flight, depths.dead, depths.workers) == (2, 1, 1, 1, 1)
    assert depths.oldest_queued_age == pytest.approx(60, abs=0.01)
    assert depths.overdue == pytest.approx(5, abs=0.01)
    assert depths.oldest_dead_age == pytest.approx(3600, abs=0.01)
    status, output = run_script(endpoint, "status.py", "--json")
    assert status == 0, output
    assert json.loads(output)["dead"] == 1


# -- settings and outputs ----------------------------------------------------------------------------

def test_settings_from_the_environment():
    settings = Settings.from_env({"RETRY_MAX_ATTEMPTS": "3", "RETRY_BACKOFF_BASE": "0.5", "WORKER_HEARTBEAT_TTL": ""})
    assert (settings.max_attempts, settings.backoff_base, settings.heartbeat_ttl) == (3, 0.5, 30.0)
    with pytest.raises(SystemExit, match="RETRY_MAX_ATTEMPTS"):
        Settings.from_env({"RETRY_MAX_ATTEMPTS": "five"})


def test_make_outputs_writes_files_the_lab_steps_accept(tmp_path):
    copy = tmp_path / "solution"
    subprocess.run(["cp", "-r", str(SOLUTION), str(copy)], check=True)
    for name in ("schedule.txt", "jitter.txt", "capped.txt", "requeue.out"):
        (copy / name).unlink()
    subprocess.run([sys.executable, str(copy / "make_outputs.py")], check=True, timeout=60,
                   env={"PATH": os.environ.get("PATH", "")})
    read = lambda name: (copy / name).read_bytes()  # noqa: E731
    assert artifacts.parse_schedule(read("schedule.txt")).ok
    assert artifacts.parse_jitter(read("jitter.txt")).ok
    assert artifacts.parse_capped(read("capped.txt")).ok
    assert artifacts.requeue_out_shows_attempts(read("requeue.out"), 2).ok
