"""Where fakeredis 2.41 differs from redis-server 7.0 on the stream commands stream-consumer relies on,
and why no check's verdict depends on it (checks/stream_consumer/README.md, "fakeredis").

Every test runs on both backends (the harness's patched fakeredis TCP server and a private redis-server,
never the shared :6379). A difference is pinned as it is on each backend, so that a fakeredis upgrade
which closes it is noticed (the README's list is then out of date), and next to it the harness's own
reading (streams.py) is asserted to be the same on both.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from retrylab.brokers import BackendUnavailable
from retrylab.brokers.redis.fakeredis_fixes import start_fake_server, stop_fake_server
from retrylab.brokers.redis.server_process import RedisServerProcess
from retrylab.checks.stream_consumer import lab, streams

BACKENDS = ["fake", "real"]


@pytest.fixture(scope="module")
def fake_port() -> Iterator[int]:
    server = start_fake_server()
    try:
        yield server.port
    finally:
        stop_fake_server(server)


@pytest.fixture(scope="module")
def real_port() -> Iterator[int]:
    try:
        process = RedisServerProcess()
        endpoint = process.start()
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield endpoint.port
    finally:
        process.stop()


@pytest.fixture(params=BACKENDS)
def backend(request) -> Iterator[tuple[str, redis.Redis]]:
    port = request.getfixturevalue(f"{request.param}_port")
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
    client.flushall()
    try:
        yield request.param, client
    finally:
        client.close()


def orders(client: redis.Redis, count: int) -> list[bytes]:
    streams.create_group(client)
    return [client.xadd(lab.STREAM, {"order_id": f"o{n}", "kind": "ok"}) for n in range(count)]


def xinfo_lag(client: redis.Redis):
    return client.xinfo_groups(lab.STREAM)[0]["lag"]


def test_xinfo_groups_lag_after_trimming_unread_entries_differs_but_the_harness_lag_does_not(backend):
    """redis-server 7.0 keeps XINFO GROUPS' lag inflated for good once unread entries are trimmed
    (redis/redis#13957); fakeredis resets it. The harness counts what is past last-delivered-id."""
    name, client = backend
    orders(client, 5)
    client.xreadgroup(lab.GROUP, "c1", {lab.STREAM: ">"}, count=2)
    assert xinfo_lag(client) == 3 and streams.group(client).lag == 5          # the same before the trim
    client.xtrim(lab.STREAM, maxlen=0)
    client.xadd(lab.STREAM, {"order_id": "late", "kind": "ok"})
    assert xinfo_lag(client) == {"fake": 1, "real": 4}[name]                # the difference
    state = streams.group(client)
    assert (state.undelivered, state.pending, state.lag) == (1, 2, 3)       # what every check reads
    assert len(streams.pending(client)) == 2    # the trimmed entries stay pending on both


def test_xinfo_groups_lag_is_none_alike_where_redis_cannot_tell(backend):
    """After XDEL of the last delivered entry, and for a group made mid-stream, lag is None on both:
    the harness never reads it, so a None is no verdict."""
    _, client = backend
    ids = orders(client, 3)
    client.xreadgroup(lab.GROUP, "c1", {lab.STREAM: ">"}, count=2)
    client.xdel(lab.STREAM, ids[1])
    assert xinfo_lag(client) is None
    assert streams.group(client).undelivered == 1
    client.delete(lab.STREAM)
    client.xadd(lab.STREAM, {"order_id": "before", "kind": "ok"})
    client.xadd(lab.STREAM, {"order_id": "before-too", "kind": "ok"})   # (after one entry, both can tell: 1)
    client.xgroup_create(lab.STREAM, lab.GROUP, id="$")
    client.xadd(lab.STREAM, {"order_id": "after", "kind": "ok"})
    assert xinfo_lag(client) is None
    assert streams.group(client).undelivered == 1


def _as_dict(reply) -> dict:
    """A map reply as a dict with str keys, whether it came as a map or as a flat list of pairs."""
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in items}


def test_xinfo_stream_full_has_no_pel_count_on_fakeredis(backend):
    """fakeredis's XINFO STREAM FULL lists a group without its pel-count, PEL and consumer list (a
    learner's lag.py reading them fails on fake alone: redis-py 8.2's xinfo_stream(full=True) even raises
    TypeError parsing that group); the checks read XINFO GROUPS and XPENDING. The reply is read unparsed,
    so what is pinned is the server's answer, not one redis-py version's reading of it."""
    name, client = backend
    orders(client, 3)
    client.xreadgroup(lab.GROUP, "c1", {lab.STREAM: ">"}, count=2)
    group = _as_dict(_as_dict(client.execute_command("XINFO", "STREAM", lab.STREAM, "FULL"))["groups"][0])
    if name == "real":
        assert group["pel-count"] == 2 and len(group["pending"]) == 2 and len(group["consumers"]) == 1
    else:
        assert "pel-count" not in group and group["pending"] == 2 and group["consumers"] == 1
    assert streams.group(client).pending == 2 and len(streams.pending(client)) == 2


def test_object_is_missing_on_fakeredis(backend):
    """OBJECT ENCODING/FREQ/IDLETIME: unknown to fakeredis. No check sends it; a learner's script that
    does gets an error on the fake backend alone."""
    name, client = backend
    orders(client, 1)
    if name == "real":
        assert client.object("encoding", lab.STREAM) == b"stream"
    else:
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.object("encoding", lab.STREAM)


def test_what_the_checks_count_on_is_the_same(backend):
    """LAB.md's measured facts: XCLAIM and XAUTOCLAIM add 1 to the delivery count, JUSTID does not but
    resets the idle time, XAUTOCLAIM returns no counts, and `MAXLEN ~` trims whole nodes of 100."""
    _, client = backend
    ids = orders(client, 2)
    client.xreadgroup(lab.GROUP, "c1", {lab.STREAM: ">"})
    time.sleep(0.05)
    claimed = client.xautoclaim(lab.STREAM, lab.GROUP, "c2", 10, "0-0", count=1)
    assert [entry_id for entry_id, _ in claimed[1]] == [ids[0]]
    client.xclaim(lab.STREAM, lab.GROUP, "c2", 0, [ids[1]], justid=True)
    deliveries = {p.id: p.deliveries for p in streams.pending(client)}
    assert deliveries == {ids[0]: 2, ids[1]: 1}
    assert max(p.idle_ms for p in streams.pending(client)) < 50
    client.delete(lab.STREAM)
    orders(client, 250)
    client.xtrim(lab.STREAM, maxlen=10, approximate=True)
    assert client.xlen(lab.STREAM) == 50
