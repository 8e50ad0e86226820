"""`retrylab verify --exercise stream-consumer`: steps 1, 3 and 5 decided read-only on a learner's live Redis.

As tests/test_verify.py: a private redis-server seeded by hand, read through a Redis ACL user that may
only read, and a full dump of the server before and after each case (verify never writes). The files are
the reference solution's, changed per case.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from retrylab import cli
from retrylab.brokers.redis.endpoint import Endpoint, free_port
from retrylab.brokers.redis.server_process import RedisServerProcess
from retrylab.checks.stream_consumer.lab import DLQ, GROUP, REFUSED, STREAM
from retrylab.fixtures.stream_consumer.corpus import REFERENCE

READER = ("reader", "pw")
EXERCISE = ("--exercise", "stream-consumer")


@pytest.fixture(scope="module")
def server():
    with RedisServerProcess() as endpoint:
        admin = endpoint.client()
        admin.acl_setuser(READER[0], enabled=True, passwords=[f"+{READER[1]}"], keys=["~*"], channels=["*"],
                          commands=["+@read", "-@write", "-@dangerous", "+ping", "+info", "+select",
                                    "+client|setname"])
        yield endpoint


@pytest.fixture
def admin(server):
    client = server.client()
    client.flushall()
    client.set("app:config", "v1", ex=3600)       # a bystander that must survive untouched
    yield client
    client.close()


def full_dump(server: Endpoint) -> dict:
    admin = server.client()
    dump = {"writes": admin.info("persistence")["rdb_changes_since_last_save"]}
    for name in admin.info("keyspace"):
        db = Endpoint(server.host, server.port, db=int(name[2:])).client()
        for key in db.scan_iter(count=1000):
            dump[(name, key)] = (db.type(key), db.dump(key), db.pexpiretime(key))
    return dump


def reader_url(server: Endpoint) -> str:
    return f"redis://{READER[0]}:{READER[1]}@{server.host}:{server.port}/0"


def submission(tmp_path: Path, changes: dict[str, str | None] | None = None) -> Path:
    folder = tmp_path / "orders-lab"
    shutil.copytree(REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
    for name, text in (changes or {}).items():
        if text is None:
            (folder / name).unlink()
        else:
            (folder / name).write_text(text)
    return folder


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def verify(capsys, *args: str) -> tuple[int, str, str]:
    status = cli.main(["verify", *EXERCISE, *args])
    out, err = capsys.readouterr()
    return status, out, err


# what the learner's Redis holds for each case: a function of the admin client

def nothing(client):
    pass


def drained(client, count=3):
    """The state a correct consumer leaves: every entry delivered and acknowledged."""
    client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    ids = [client.xadd(STREAM, {"order_id": f"o{n}", "kind": "ok", "priority": "normal"}) for n in range(count)]
    client.xreadgroup(GROUP, "c1", {STREAM: ">"})
    client.xack(STREAM, GROUP, *ids)
    return ids


def one_pending_one_undelivered(client):
    client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    ids = [client.xadd(STREAM, {"order_id": f"o{n}", "kind": "ok"}) for n in range(3)]
    client.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=2)
    client.xack(STREAM, GROUP, ids[0])


def group_only(client):
    client.xgroup_create(STREAM, GROUP, id="$", mkstream=True)


def stream_without_group(client):
    client.xadd(STREAM, {"order_id": "o1", "kind": "ok"})


def orders_is_a_list(client):
    client.rpush(STREAM, "o1")


def dead_lettered(**override):
    """A poison entry dead-lettered as the reference does, with `override` on the dead letter's fields
    (None drops one); `pending=True` leaves its source entry pending."""
    pending = override.pop("pending", False)

    def state(client):
        ids = drained(client)
        poison = client.xadd(STREAM, {"order_id": "p1", "kind": "poison", "priority": "high"})
        client.xreadgroup(GROUP, "c1", {STREAM: ">"})
        if not pending:
            client.xack(STREAM, GROUP, poison)
        letter = {"order_id": "p1", "kind": "poison", "priority": "high", "error": "EffectError: poison",
                  "deliveries": "3", "source_id": poison.decode()}
        letter.update({k: v for k, v in override.items() if v is not None})
        for name in [k for k, v in override.items() if v is None]:
            del letter[name]
        client.xadd(DLQ, letter)
        return ids
    return state


def refusals(*records):
    def state(client):
        for record in records:
            client.xadd(REFUSED, record)
    return state


# step, file changes, Redis state, exit status, a phrase the report must contain
CASES = {
    "1-done": (1, {}, drained, 0, "nothing is pending in group workers"),
    "1-done-empty-stream": (1, {}, group_only, 0, "every entry of orders was delivered"),
    "1-no-stream": (1, {}, nothing, 1, "Stream orders does not exist"),
    "1-no-group": (1, {}, stream_without_group, 1, "has no group workers"),
    "1-pending-and-undelivered": (1, {}, one_pending_one_undelivered, 1, "1 entry is still pending"),
    "1-orders-is-a-list": (1, {}, orders_is_a_list, 1, "orders is a Redis list, not a stream"),
    "1-consumer-missing": (1, {"consumer.py": None}, drained, 1, "consumer.py is missing"),
    "1-consumer-syntax": (1, {"consumer.py": "def main(:\n"}, drained, 1, "consumer.py does not compile"),
    "3-done": (3, {}, dead_lettered(), 0, "the dead letter has error, deliveries = 3 and source_id"),
    "3-no-dlq": (3, {}, drained, 1, "orders:dlq does not exist"),
    "3-dlq-is-a-hash": (3, {}, lambda c: c.hset(DLQ, "x", "1"), 1, "orders:dlq is a Redis hash"),
    "3-lacks-error": (3, {}, dead_lettered(error=None), 1, "lacks error"),
    "3-empty-error": (3, {}, dead_lettered(error=" "), 1, "has an empty error"),
    "3-deliveries-2": (3, {}, dead_lettered(deliveries="2"), 1, "has deliveries = \"2\""),
    "3-deliveries-binary": (3, {}, dead_lettered(deliveries=b"\xff\x00"), 1, "has deliveries = \"\\xff"),
    "3-source-id-not-an-id": (3, {}, dead_lettered(source_id="p1"), 1, "which is no entry id"),
    "3-source-still-pending": (3, {}, dead_lettered(pending=True), 1, "is still pending in group workers"),
    "3-fields-not-kept": (3, {}, dead_lettered(kind="ok"), 1, "its kind should be \"poison\""),
    "5-done": (5, {}, drained, 0, "lag.py should print 0"),
    "5-done-with-lag": (5, {}, one_pending_one_undelivered, 0, "the lag now: 2 = 1 undelivered + 1 pending"),
    "5-no-group": (5, {}, stream_without_group, 1, "has no group workers"),
    "5-lag-missing": (5, {"lag.py": None}, drained, 1, "lag.py is missing"),
    "6-no-refusals": (6, {}, nothing, 0, "orders:refused does not exist"),
    "6-refusals-ok": (6, {}, refusals({"order_id": "o1", "reason": "lag 25 > 20"}), 0, "has an order_id and a reason"),
    "6-refusal-without-reason": (6, {}, refusals({"order_id": "o1"}), 1, "lacks reason"),
    "2-drained": (2, {}, drained, 0, "nothing is pending"),
    "4-pending": (4, {}, one_pending_one_undelivered, 1, "still pending"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_decides_the_step_read_only(case, server, admin, tmp_path, capsys):
    step, changes, state, expected, phrase = CASES[case]
    folder = submission(tmp_path, changes)
    state(admin)
    files, before = snapshot(folder), full_dump(server)

    status, out, err = verify(capsys, "--step", str(step), "--redis-url", reader_url(server), str(folder))

    assert (status, err) == (expected, ""), out
    assert phrase in out, out
    assert ("DONE" if expected == 0 else "NOT YET") in out
    assert f"retrylab check {folder} --step {step}" in out
    assert "not checked (only running your code can show it):" in out
    assert full_dump(server) == before          # nothing written
    assert snapshot(folder) == files            # nor in the learner's directory (no bytecode either)


def test_a_flooded_stream_is_read_bounded(server, admin, tmp_path, capsys):
    admin.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    with admin.pipeline(transaction=False) as pipe:
        for n in range(5000):
            pipe.xadd(STREAM, {"order_id": f"o{n}", "kind": "ok"})
        pipe.execute()
    status, out, _ = verify(capsys, "--step", "1", "--redis-url", reader_url(server), str(submission(tmp_path)))
    assert status == 1 and "at least 2000 entries of orders were never delivered" in out, out


@pytest.mark.parametrize("step", [1, 3, 5])
def test_unreachable_redis_cannot_check_one_line_no_traceback(step, tmp_path):
    done = subprocess.run([sys.executable, "-m", "retrylab", "verify", *EXERCISE, "--step", str(step),
                           "--redis-url", f"redis://127.0.0.1:{free_port()}/0", str(submission(tmp_path))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and f"cannot check step {step}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_script_decides_step_5_even_when_redis_is_down(tmp_path, capsys):
    folder = submission(tmp_path, {"lag.py": None})
    status, out, _ = verify(capsys, "--step", "5", "--redis-url", f"redis://127.0.0.1:{free_port()}/0", str(folder))
    assert status == 1 and "lag.py is missing" in out


def test_wrong_password_cannot_check(server, admin, tmp_path, capsys):
    url = f"redis://{READER[0]}:nope@{server.host}:{server.port}/0"
    status, out, err = verify(capsys, "--step", "3", "--redis-url", url, str(submission(tmp_path)))
    assert status == 2 and out == ""
    assert "cannot check step 3" in err and "nope" not in err


@pytest.mark.parametrize("args, reason", [
    (["--step", "7", "."], "no step 7"),
    (["--step", "1", "/no/such/dir"], "is not a directory"),
])
def test_bad_arguments_exit_2_with_one_line(args, reason, capsys):
    status, out, err = verify(capsys, *args)
    assert status == 2 and out == ""
    assert reason in err and len(err.strip().splitlines()) == 1


SCRIPTS = {"zh": r"[\u4e00-\u9fff]", "ru": r"[\u0400-\u04ff]", "fa": r"[\u0600-\u06ff]"}


@pytest.mark.parametrize("lang", ["en", "ru", "fa", "zh"])
def test_verify_says_the_same_facts_in_every_language(lang, server, admin, tmp_path):
    """The same verdict and the same facts (their numbers and the lab's names) in each language; every
    line the report's frame and the facts make is in that language."""
    import re

    from retrylab import bidi, i18n
    from retrylab import verify as verifying
    dead_lettered(deliveries="2")(admin)
    folder = submission(tmp_path)
    results = {code: verifying.verify(folder, 3, broker_url=reader_url(server), exercise_id="stream-consumer",
                                      lang=code) for code in ("en", lang)}
    english, result = results["en"], results[lang]
    assert [f.status for f in result.facts] == [f.status for f in english.facts] == ["ok", "fail"]
    assert len(result.unchecked) == 2

    def facts(text: str) -> list[str]:
        return sorted(re.findall(r"orders:dlq|\b\d+(?:-\d+)?\b", text))
    for fact, reference in zip(result.facts, english.facts):
        assert facts(fact.text) == facts(reference.text), (fact.text, reference.text)
    shown = verifying.render(result)
    if lang == "en":
        assert not any(re.search(p, shown) for p in SCRIPTS.values())
    else:
        for line in (f.text for f in result.facts):
            assert re.search(SCRIPTS[lang], line), line
        for line in result.unchecked:
            assert re.search(SCRIPTS[lang], line), line
    if lang in i18n.RTL:
        assert bidi.bidi_problems(shown) == []


def test_a_url_that_is_no_redis_url_cannot_check(tmp_path, capsys):
    status, out, err = verify(capsys, "--step", "1", "--redis-url", "http://example.invalid/0", str(submission(tmp_path)))
    assert status == 2 and out == ""
    assert "cannot check step 1" in err and len(err.strip().splitlines()) == 1
