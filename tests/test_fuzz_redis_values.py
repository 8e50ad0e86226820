"""Whatever a learner's script leaves in Redis, the harness's readers give a verdict with a bounded
message, never a traceback: random bytes, huge values, odd Unicode, NaN/Infinity, JSON of the wrong
shape, and q:tasks / q:tasks:dlq of the wrong Redis type (hash, zset, set, string, stream).

Three layers: the readers alone on a private Redis (many examples, both backends); keyspace.dump
while a script changes a key's type under it; and whole gradings of a submission whose scripts
write hypothesis-made junk (few examples: each is a grading)."""
from __future__ import annotations

import base64
import json
import math
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retrylab.brokers.redis import keyspace
from retrylab.brokers.redis.backends import make_backend
from retrylab.checks.backoff_dlq import stored_values as dlq_messages
from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq import lab
from retrylab.fixtures.backoff_dlq import message_factory
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE
from retrylab.grading import grade
from retrylab.brokers.redis.commands import Command
from retrylab.runner import ScriptRun

BACKENDS = ["fake", "redis-server"]
KINDS = ["list", "hash", "zset", "set", "string", "stream", "absent"]
MESSAGE_BOUND = 6000        # a step's message: the verdict (at most 4000) and the hint
BAD = "@BAD@"               # replaced by the seeded failing message's id in end-to-end junk

json_leaves = (st.none() | st.booleans() | st.integers(min_value=-(10 ** 30), max_value=10 ** 30)
               | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
               | st.sampled_from([BAD, "\u202e", "\ud7ff\U0001f4a9", "\x00", "2024-01-01T00:00:00Z", ""]))
json_values = st.recursive(json_leaves, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)
entry_like = st.fixed_dictionaries({}, optional={
    "payload": json_values | st.fixed_dictionaries({"id": st.just(BAD), "kind": st.just("bad"), "data": json_values}),
    "error": json_values, "attempts": json_values, "first_seen_at": json_values, "id": json_values})
values = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=80).map(lambda t: t.encode("utf-8")),
    st.sampled_from([b"\xed\xa0\x80", b"\xef\xbb\xbf{}", b"[" * 5000, b"{'payload': 1}", b"", b" \r\n",
                     b"x" * ((1 << 20) + 1), b"\xff" * (2 << 20)]),   # a lone surrogate, a BOM, deep, a repr, huge
    json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    entry_like.map(lambda v: json.dumps(v, allow_nan=True).encode()),
)
key_content = st.tuples(st.sampled_from(KINDS), st.lists(values, min_size=1, max_size=6))


def _store(client, key: str, kind: str, items: list[bytes]) -> None:
    """Put `items` under `key` as a Redis `kind`."""
    client.delete(key)
    if kind == "list":
        client.rpush(key, *items)
    elif kind == "hash":
        client.hset(key, mapping={b"f%d" % i: v for i, v in enumerate(items)})
    elif kind == "zset":
        client.zadd(key, {v: [float("inf"), -1.5, 0, 1e300][i % 4] for i, v in enumerate(items)})
    elif kind == "set":
        client.sadd(key, *items)
    elif kind == "string":
        client.set(key, items[0])
    elif kind == "stream":
        for value in items:
            client.xadd(key, {b"v": value, b"\xff": b""})


def _check_readers(content: dict) -> None:
    """Every reader the checks use, on everything that was read; problems stay short."""
    for key, found in content.items():
        assert isinstance(found, keyspace.KeyContent) and all(isinstance(v, bytes) for v in found.values)
        assert len(found.values) <= 2 * keyspace.MAX_ELEMENTS
    seeded = message_factory.worker_batch()[0]
    for raw in observe.dlq_entries(content.get(lab.DLQ.encode())) + observe.dlq_entries(
            content.get(lab.QUEUE.encode())):
        value, problem = dlq_messages.decode_json(raw)
        assert len(problem) <= dlq_messages.MAX_PROBLEM
        dlq_messages.shorten(raw.decode("utf-8", "replace"))
        dlq_messages.message_id(value)
        dlq_messages.attempts_of(value)
        dlq_messages.original_fields(value)
        assert len(dlq_messages.same_original(value, seeded)) <= dlq_messages.MAX_PROBLEM
        if isinstance(value, dict):
            stamp, why = dlq_messages.parse_timestamp(value.get("first_seen_at"))
            assert stamp is None or math.isfinite(stamp)
            assert len(why) <= dlq_messages.MAX_PROBLEM
    keyspace.mentions(content, b"anything")


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    backend = make_backend(request.param)
    backend.start()
    yield backend
    backend.stop()


@pytest.fixture
def loud_readers(monkeypatch):
    """A bug in the readers fails the test instead of becoming a polite "could not interpret"."""
    monkeypatch.setattr(dlq_messages, "_RAISE_INTERNAL_ERRORS", True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(queue=key_content, dlq=key_content, other=key_content)
def test_readers_survive_any_content_of_the_queues(backend, loud_readers, queue, dlq, other):
    with backend.private() as endpoint, endpoint.client() as client:
        for key, (kind, items) in ((lab.QUEUE, queue), (lab.DLQ, dlq), ("\xff junk \u202e", other)):
            if kind != "absent":
                _store(client, key, kind, items)
        shape = keyspace.shape(client)
        content = keyspace.dump(client)
    assert {k for k, _, _ in shape} == set(content)
    _check_readers(content)


@pytest.mark.parametrize("kind", KINDS[:-1])
def test_huge_values_are_read_bounded(backend, loud_readers, kind):
    huge = [b"\x00not json\xff" * ((20 << 20) // 11), b"{\"payload\": NaN}"]
    with backend.private() as endpoint, endpoint.client() as client:
        _store(client, lab.DLQ, kind, huge)
        content = keyspace.dump(client)
    assert content[lab.DLQ.encode()].type == kind
    _check_readers(content)


def test_a_key_changing_type_under_the_reader(backend):
    """A worker turning q:tasks from a list into a zset and back while the harness polls it."""
    with backend.private() as endpoint, endpoint.client() as client, endpoint.client() as other:
        stop = threading.Event()

        def flip():
            while not stop.is_set():
                other.delete(lab.QUEUE)
                other.rpush(lab.QUEUE, b"a", b"b")
                other.delete(lab.QUEUE)
                other.zadd(lab.QUEUE, {b"a": 1})

        flipper = threading.Thread(target=flip, daemon=True)
        flipper.start()
        try:
            for _ in range(150):
                keyspace.shape(client)
                content = keyspace.dump(client)
                assert set(content) <= {lab.QUEUE.encode()}
        finally:
            stop.set()
            flipper.join()


@settings(max_examples=60, deadline=None)
@given(commands=st.lists(st.tuples(st.sampled_from(["RPUSH", "LPUSH", "ZADD", "SET", "HSET", "EVAL", "XADD",
                                                    "rpush", "GET", ""]),
                                   st.lists(values, max_size=4)), max_size=8),
       bad_id=st.text(max_size=40))
def test_what_a_script_sent_is_read_without_fail(commands, bad_id):
    recorded = tuple(Command(seq=i, conn=1, at=0.0, args=tuple(a for a in ([name.encode()] if name else []) + args),
                             truncated=False) for i, (name, args) in enumerate(commands))
    run = ScriptRun(result=None, calls=(), commands=recorded)
    dlq_messages._RAISE_INTERNAL_ERRORS = True
    try:
        for _, _, value in observe.written_values(run, exclude_key=lab.DLQ):
            dlq_messages.message_id(value)
        counts = observe.requeue_counts(run, bad_id)
    finally:
        dlq_messages._RAISE_INTERNAL_ERRORS = False
    assert all(c is None or isinstance(c, int) for c in counts)


@settings(max_examples=400, deadline=None)
@given(raw=values | st.text(max_size=40) | st.builds(lambda ws, v: ws + v, st.sampled_from([b"", b" \t\r\n", b"\xef\xbb\xbf ",
                                                                                        b"\x0b", b"\x0c"]), values))
def test_the_cheap_prefilter_never_hides_an_object_or_a_string(raw):
    """written_values skips what may_hold_object_or_string refuses: it must refuse only values decode_json would
    not give as an object or string (else a requeue would go unseen)."""
    value, problem = dlq_messages.decode_json(raw)
    if not problem and isinstance(value, (dict, str)):
        assert dlq_messages.may_hold_object_or_string(raw)


# ------------------------------------------------------------------------------------------------
# whole gradings

JUNK_STORE = '''
"""Leaves the junk of junk.json in Redis, as the Redis types it names."""
import base64, json, os
import redis

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))


def store(key, kind, items):
    r.delete(key)
    if kind == "list":
        r.rpush(key, *items)
    elif kind == "hash":
        r.hset(key, mapping={b"f%d" % i: v for i, v in enumerate(items)})
    elif kind == "zset":
        r.zadd(key, {v: float(i) for i, v in enumerate(items)})
    elif kind == "set":
        r.sadd(key, *items)
    elif kind == "string":
        r.set(key, items[0])
    elif kind == "stream":
        for v in items:
            r.xadd(key, {b"v": v})


def leave(section, bad_id=b""):
    with open("junk.json") as f:
        for key, kind, items in json.load(f)[section]:
            if kind != "absent":
                store(key, kind, [base64.b64decode(i).replace(b"@BAD@", bad_id) for i in items])
'''
JUNK_WORKER = '''
"""Processes the queue (the failing message 5 times), then leaves junk behind."""
import json, sys
from junk_store import leave, r
sys.path.append("/opt/app")
from taskproc import process

bad_id = b""
while (raw := r.lpop("q:tasks")) is not None:
    msg = json.loads(raw)
    if msg.get("kind") == "bad":
        bad_id = msg["id"].encode()
    for _ in range(5 if msg.get("kind") == "bad" else 1):
        try:
            process(msg)
        except Exception:
            pass
leave("worker", bad_id)
'''


def _junk_submission(folder: Path, worker: list, replay: list) -> Path:
    shutil.copytree(REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
    encode = lambda section: [[key, kind, [base64.b64encode(i).decode() for i in items]]  # noqa: E731
                              for key, (kind, items) in section]
    (folder / "junk.json").write_text(json.dumps({"worker": encode(worker), "replay": encode(replay)}))
    (folder / "junk_store.py").write_text(JUNK_STORE)
    (folder / "worker.py").write_text(JUNK_WORKER)
    (folder / "replay.py").write_text("from junk_store import leave\nleave(\"replay\")\n")
    return folder


small_values = values.filter(lambda v: len(v) < (64 << 10))
queue_junk = st.lists(st.tuples(st.sampled_from([lab.QUEUE, lab.DLQ]),
                                st.tuples(st.sampled_from(KINDS), st.lists(small_values, min_size=1, max_size=4))),
                      min_size=1, max_size=2)


@pytest.mark.parametrize("backend_name, examples", [("fake", 4), ("redis-server", 2)])
def test_grading_gives_verdicts_whatever_the_scripts_leave_in_redis(backend_name, examples, tmp_path_factory):
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(worker=queue_junk, replay=queue_junk)
    def grade_junk(worker, replay):
        folder = _junk_submission(tmp_path_factory.mktemp("junk") / "submission", worker, replay)
        report = grade(folder, backend=backend_name, steps=(1, 2, 6, 7, 8))
        explain = "\n".join(f"{r.name} {r.status}: {r.message[:300]}" for r in report.results)
        assert not report.harness_error and all(r.status in ("pass", "fail") for r in report.results), explain
        assert all(len(r.message) < MESSAGE_BOUND for r in report.results), explain
        assert {r.number: r.status for r in report.lab_results}[1] == "pass", explain  # the junk came after

    grade_junk()
