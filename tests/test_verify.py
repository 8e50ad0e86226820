"""`retrylab verify --step N DIR`: the live, read-only check a lab platform's button runs.

Every case runs against a private redis-server seeded by hand, connected as a Redis ACL user that
may only read, and compares a full dump of the server (every database, every type, values and
expiry times, and the server's count of writes) before and after: verify never writes. The files
are the reference solution's, changed per case.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from retrylab import cli
from retrylab.brokers.redis.endpoint import Endpoint, free_port
from retrylab.brokers.redis.server_process import RedisServerProcess
from retrylab.fixtures.backoff_dlq import corpus
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE
from retrylab.checks.backoff_dlq.lab import DLQ, QUEUE

READER = ("reader", "pw")
ORIGINAL = {"id": "9b1c5e0f6a7d4c2b8e3f1a0d5c6b7e8f", "kind": "bad", "data": {"order": 7, "note": "x"}}


@pytest.fixture(scope="module")
def server():
    with RedisServerProcess() as endpoint:
        admin = endpoint.client()
        # may read keys and connect (ping, select, setname) and nothing else: any write is refused
        admin.acl_setuser(READER[0], enabled=True, passwords=[f"+{READER[1]}"], keys=["~*"], channels=["*"],
                          commands=["+@read", "-@write", "-@dangerous", "+ping", "+info", "+select",
                                    "+client|setname"])
        yield endpoint


@pytest.fixture
def admin(server):
    client = server.client()
    client.flushall()
    _seed_bystanders(server)
    yield client
    client.close()


def _seed_bystanders(server: Endpoint) -> None:
    """Keys of every type, some with a TTL, in the learner's db and another one: all must survive."""
    db0 = server.client()
    db0.set("app:config", "v1", ex=3600)
    db0.hset("app:hash", mapping={"a": "1", "b": "2"})
    db0.sadd("app:set", "x", "y")
    db0.zadd("app:zset", {"m": 1.5})
    db0.xadd("app:stream", {"f": "v"})
    db0.rpush("app:list", "one", "two")
    db0.pexpire("app:list", 7_200_000)
    server_db4 = Endpoint(server.host, server.port, db=4).client()
    server_db4.rpush(QUEUE, json.dumps({**ORIGINAL, "attempts": 3}))   # another db's q:tasks: not ours


def full_dump(server: Endpoint) -> dict:
    """Every key of every database: type, serialized value, absolute expiry; and the write count."""
    admin = server.client()
    dump = {"writes": admin.info("persistence")["rdb_changes_since_last_save"]}
    for name in admin.info("keyspace"):
        db = Endpoint(server.host, server.port, db=int(name[2:])).client()
        for key in db.scan_iter(count=1000):
            dump[(name, key)] = (db.type(key), db.dump(key), db.pexpiretime(key))
    return dump


def reader_url(server: Endpoint, db: int = 0) -> str:
    return f"redis://{READER[0]}:{READER[1]}@{server.host}:{server.port}/{db}"


def submission(tmp_path: Path, changes: dict[str, str | None] | None = None) -> Path:
    folder = tmp_path / "qr"
    shutil.copytree(REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in (changes or {}).items():
        if text is None:
            (folder / name).unlink()
        else:
            (folder / name).write_text(text)
    return folder


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def seed(server: Endpoint, state: dict, db: int = 0) -> None:
    client = Endpoint(server.host, server.port, db=db).client()
    for key, values in state.items():
        if isinstance(values, dict):
            client.hset(key, mapping=values)
        else:
            client.rpush(key, *values)


def verify(capsys, *args: str) -> tuple[int, str, str]:
    status = cli.main(["verify", *args])
    out, err = capsys.readouterr()
    return status, out, err


def message(**fields) -> str:
    return json.dumps({**ORIGINAL, **fields})


def entry(**overrides) -> str:
    record = {"payload": ORIGINAL, "error": "RuntimeError: task 9b1c: kind=bad is rejected by taskproc",
              "attempts": 5, "first_seen_at": 1796037722.677}
    record.update(overrides)
    return json.dumps({k: v for k, v in record.items() if v is not DROP})


DROP = object()

# step, file changes, Redis state (db 0), exit status, a phrase the report must contain
CASES = {
    "1-done": (1, {}, {}, 0, "worker.py mentions q:tasks"),
    "1-missing": (1, {"worker.py": None}, {}, 1, "worker.py is missing"),
    "1-syntax-error": (1, {"worker.py": "def main(:\n    pass\n"}, {}, 1, "worker.py does not compile"),
    "1-other-queue": (1, {"worker.py": "import redis\nfrom taskproc import process\nr = redis.Redis()\n"
                                       "print(r.blpop('tasks'))\n"}, {}, 1, "never mentions q:tasks"),
    "2-done-count-in-queue": (2, {}, {QUEUE: [message(attempts=2)]}, 0,
                              "1 of the 1 message(s) read from q:tasks carry an integer attempts count"),
    "2-done-empty-redis": (2, {}, {}, 0, "q:tasks is empty: no message there"),
    "2-count-as-text": (2, {}, {QUEUE: [message(attempts="2")]}, 1, "must be an integer"),
    "2-requeue-out-shows-1": (2, {"requeue.out": "requeued attempts=1\n"}, {}, 1, "never shows attempts=2"),
    "6-done": (6, {}, {DLQ: [entry()]}, 0, "q:tasks:dlq holds 1 entry"),
    "6-queue-not-empty": (6, {}, {QUEUE: [message(attempts=4)], DLQ: [entry()]}, 1, "still holds 1 message"),
    "6-no-dlq": (6, {}, {}, 1, "q:tasks:dlq does not exist"),
    "6-two-entries": (6, {}, {DLQ: [entry(), entry()]}, 1, "holds 2 entries"),
    "6-dlq-is-a-hash": (6, {}, {DLQ: {"x": entry()}}, 1, "is a Redis hash"),
    "7-done": (7, {}, {DLQ: [entry()]}, 0, "first_seen_at is a timestamp"),
    "7-done-iso-envelope": (7, {}, {DLQ: [entry(first_seen_at="2026-11-30T11:45:53Z",
                                                payload=json.dumps(ORIGINAL))]}, 0, "attempts is 5"),
    "7-python-repr": (7, {}, {DLQ: [repr({"payload": ORIGINAL, "attempts": 5})]}, 1, "Python repr"),
    "7-missing-first-seen": (7, {}, {DLQ: [entry(first_seen_at=DROP)]}, 1, "lacks first_seen_at"),
    "7-attempts-text": (7, {}, {DLQ: [entry(attempts="5")]}, 1, "store the integer 5"),
    "7-attempts-4": (7, {}, {DLQ: [entry(attempts=4)]}, 1, "attempts is 4"),
    "7-empty-error": (7, {}, {DLQ: [entry(error="")]}, 1, "record the exception's text"),
    "7-bad-timestamp": (7, {}, {DLQ: [entry(first_seen_at="yesterday")]}, 1, "not a timestamp"),
    "7-payload-text": (7, {}, {DLQ: [entry(payload="task failed")]}, 1, "must be the original message"),
    "7-second-entry-wrong": (7, {}, {DLQ: [entry(), entry(attempts=6)]}, 1, "DLQ entry 2 of 2: attempts is 6"),
    "7-no-entry": (7, {}, {}, 1, "finish step 6 first"),
    "8-done": (8, {}, {QUEUE: [message(attempts=0)]}, 0, "carries attempts 0"),
    "8-done-envelope": (8, {}, {QUEUE: [json.dumps({"payload": ORIGINAL, "attempts": 0})]}, 0, "carries a payload"),
    "8-dlq-not-emptied": (8, {}, {QUEUE: [message(attempts=0)], DLQ: [entry()]}, 1, "still holds 1 entry"),
    "8-attempts-kept": (8, {}, {QUEUE: [message(attempts=5)]}, 1, "reset it to 0"),
    "8-two-messages": (8, {}, {QUEUE: [message(attempts=0), message(attempts=0)]}, 1, "holds 2 messages"),
    "8-not-json": (8, {}, {QUEUE: ["{'id': 1}"]}, 1, "Python repr"),
    "8-replay-missing": (8, {"replay.py": None}, {QUEUE: [message(attempts=0)]}, 1, "replay.py is missing"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_decides_the_step_read_only(case, server, admin, tmp_path, capsys):
    step, changes, state, expected, phrase = CASES[case]
    folder = submission(tmp_path, changes)
    seed(server, state)
    files, before = snapshot(folder), full_dump(server)

    status, out, err = verify(capsys, "--step", str(step), "--redis-url", reader_url(server), str(folder))

    assert (status, err) == (expected, ""), out
    assert phrase in out, out
    assert ("DONE" if expected == 0 else "NOT YET") in out
    assert f"retrylab check {folder} --step {step}" in out
    if expected:
        assert "Hint:" in out
    assert full_dump(server) == before          # nothing written, on any database
    assert snapshot(folder) == files            # nor in the learner's directory (no bytecode either)


def test_the_reader_user_really_cannot_write(server, admin):
    reader = redis.Redis.from_url(reader_url(server))
    assert reader.llen(QUEUE) == 0
    with pytest.raises(redis.exceptions.NoPermissionError):
        reader.rpush(QUEUE, "x")


def test_steps_that_run_code_say_what_they_could_not_check(server, admin, tmp_path, capsys):
    seed(server, {DLQ: [entry()]})
    status, out, _ = verify(capsys, "--step", "6", "--redis-url", reader_url(server), str(submission(tmp_path)))
    assert status == 0
    assert "not checked (only running your code can show it):" in out
    assert "exactly 5 times" in out
    assert f"redis: {server.url.replace('/0', '')}" in out and "pw" not in out   # the URL without the password


def test_the_database_in_the_url_is_the_one_read(server, admin, tmp_path, capsys):
    seed(server, {QUEUE: [message(attempts=0)]}, db=3)
    seed(server, {DLQ: [entry()]}, db=0)                     # db 0 would say "not yet"
    before = full_dump(server)
    status, out, _ = verify(capsys, "--step", "8", "--redis-url", reader_url(server, 3), str(submission(tmp_path)))
    assert status == 0, out
    assert full_dump(server) == before


@pytest.mark.parametrize("step", [3, 4, 5])
def test_file_steps_need_no_redis(step, tmp_path, capsys):
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    status, out, err = verify(capsys, "--step", str(step), "--redis-url", nobody, str(submission(tmp_path)))
    assert (status, err) == (0, ""), out
    assert "redis: not needed for this step" in out


def test_a_file_that_fails_decides_even_when_redis_is_down(tmp_path, capsys):
    folder = submission(tmp_path, {"requeue.out": "nothing here\n"})
    status, out, _ = verify(capsys, "--step", "2", "--redis-url", f"redis://127.0.0.1:{free_port()}/0", str(folder))
    assert status == 1 and "does not show attempts=2" in out


def test_unreachable_redis_cannot_check_one_line_no_traceback(tmp_path):
    done = subprocess.run([sys.executable, "-m", "retrylab", "verify", "--step", "6", "--redis-url",
                           f"redis://127.0.0.1:{free_port()}/0", str(submission(tmp_path))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "cannot check step 6" in done.stderr
    assert "Traceback" not in done.stderr


def test_wrong_password_cannot_check(server, admin, tmp_path, capsys):
    url = f"redis://{READER[0]}:nope@{server.host}:{server.port}/0"
    status, out, err = verify(capsys, "--step", "6", "--redis-url", url, str(submission(tmp_path)))
    assert status == 2 and out == ""
    assert "cannot check step 6" in err and "nope" not in err


@pytest.mark.parametrize("args, reason", [
    (["--step", "9", "."], "no step 9"),
    (["--step", "1", "/no/such/dir"], "is not a directory"),
])
def test_bad_arguments_exit_2_with_one_line(args, reason, capsys):
    status, out, err = verify(capsys, *args)
    assert status == 2 and out == ""
    assert reason in err and len(err.strip().splitlines()) == 1


ENTRIES = corpus.entries()


@pytest.mark.parametrize("entry_", ENTRIES, ids=[e.id for e in ENTRIES])
def test_verify_agrees_with_check_on_the_corpus(entry_, server, admin, tmp_path, capsys):
    """Files steps 3-5: the same verdict as `check` (same parsers). Steps 1-2, read from files and an
    empty Redis: verify never says "not yet" where check passes, and passes every correct entry."""
    folder = entry_.materialize(tmp_path / "submission")
    for step in (1, 2, 3, 4, 5):
        status, out, _ = verify(capsys, "--step", str(step), "--redis-url", reader_url(server), str(folder))
        verdict = {0: "pass", 1: "fail"}[status]
        if step >= 3 or entry_.kind == "correct":
            assert verdict == entry_.expect[step], f"{entry_.id} step {step}: {entry_.why}\n{out}"
        elif verdict == "fail":
            assert entry_.expect[step] == "fail", f"{entry_.id} step {step}\n{out}"
