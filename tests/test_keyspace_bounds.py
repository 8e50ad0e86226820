"""The keyspace reader (retrylab.brokers.redis.keyspace) bounds what crosses into the grading process, on both backends."""
from __future__ import annotations

import pytest

from retrylab.brokers.redis import keyspace

MIB = 1 << 20


@pytest.fixture(params=["fake", "real"])
def client(request):
    endpoint = request.getfixturevalue("fake_endpoint" if request.param == "fake" else "private_redis_server")
    with endpoint.client() as client:
        client.flushall()
        yield client
        client.flushall()


def test_values_are_cut_and_marked(client):
    big = b"{" + b"x" * (MIB - 1)
    client.rpush("q:tasks:dlq", b'{"id": "small"}', big)
    client.set("blob", big)
    client.hset("h", mapping={"f": big, "g": "1"})
    content = keyspace.dump(client)
    dlq = content[b"q:tasks:dlq"]
    assert dlq.values[0] == b'{"id": "small"}' and dlq.sizes == (15, MIB)
    assert dlq.values[1] == big[:keyspace.MAX_VALUE_BYTES] and dlq.truncated
    assert content[b"blob"].values == (big[:keyspace.MAX_VALUE_BYTES],) and content[b"blob"].sizes == (MIB,)
    assert content[b"h"].truncated and max(len(v) for v in content[b"h"].values) == keyspace.MAX_VALUE_BYTES
    client.delete("blob", "h")
    client.rpush("ok", "a", "b")
    content = keyspace.dump(client)
    assert not content[b"ok"].truncated and content[b"ok"].values == (b"a", b"b")


def test_the_total_is_bounded(client, monkeypatch):
    monkeypatch.setattr(keyspace, "MAX_TOTAL_BYTES", 3 * keyspace.MAX_VALUE_BYTES)
    value = b"v" * keyspace.MAX_VALUE_BYTES
    for i in range(4):
        client.rpush(f"list{i}", value, value)
    content = keyspace.dump(client)
    assert sum(len(v) for c in content.values() for v in c.values) <= 3 * keyspace.MAX_VALUE_BYTES
    assert [c.truncated for _, c in sorted(content.items())] == [False, True, True, True]


def test_only_the_first_keys_leave_the_server(client, monkeypatch):
    monkeypatch.setattr(keyspace, "MAX_KEYS", 5)
    client.mset({f"k{i:02}": "x" for i in range(20)})
    assert [k for k, _, _ in keyspace.shape(client)] == [f"k{i:02}".encode() for i in range(5)]
