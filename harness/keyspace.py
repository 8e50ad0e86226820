"""Reading a private Redis's whole keyspace, bounded so hostile data cannot stall the harness."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import redis

MAX_KEYS = 1000
MAX_ELEMENTS = 1000


@dataclass(frozen=True)
class KeyContent:
    type: str
    length: int
    values: tuple[bytes, ...]   # list/zset/set members, hash values, the string itself (first MAX_ELEMENTS)


def shape(client: redis.Redis) -> tuple:
    """Each key's type and length: cheap enough to poll every few milliseconds."""
    keys = sorted(client.keys("*"))[:MAX_KEYS]
    if not keys:
        return ()
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.type(key)
        types = [t.decode() if isinstance(t, bytes) else t for t in pipe.execute()]
    with client.pipeline(transaction=False) as pipe:
        for key, kind in zip(keys, types):
            _length(pipe, key, kind)
        # a script may change a key's type between the two pipelines (WRONGTYPE): skip it this time
        lengths = pipe.execute(raise_on_error=False)
    # Real Redis never keeps an empty key; fakeredis can (LMPOP draining a list): treat it as gone.
    return tuple((k, t, n) for k, t, n in zip(keys, types, lengths) if isinstance(n, int) and n)


def _length(pipe, key, kind):
    {"list": pipe.llen, "zset": pipe.zcard, "set": pipe.scard, "hash": pipe.hlen,
     "string": pipe.strlen, "stream": pipe.xlen}.get(kind, pipe.exists)(key)


def dump(client: redis.Redis) -> dict[bytes, KeyContent]:
    result = {}
    for key, kind, length in shape(client):
        result[key] = KeyContent(kind, int(length), _values(client, key, kind))
    return result


def _values(client: redis.Redis, key: bytes, kind: str) -> tuple[bytes, ...]:
    last = MAX_ELEMENTS - 1
    try:
        if kind == "list":
            return tuple(client.lrange(key, 0, last))
        if kind == "zset":
            return tuple(client.zrange(key, 0, last))
        if kind == "set":
            return tuple(client.srandmember(key, MAX_ELEMENTS) or ())
        if kind == "hash":
            pairs = itertools.islice(client.hscan_iter(key), MAX_ELEMENTS)
            return tuple(part for pair in pairs for part in pair)
        if kind == "string":
            return (client.getrange(key, 0, 1 << 20),)
        if kind == "stream":
            return tuple(v for _, fields in client.xrange(key, count=MAX_ELEMENTS) for v in fields.values())
    except redis.ResponseError:
        pass  # the key changed type between reading its type and its values
    return ()


def mentions(content: dict[bytes, KeyContent], needle: bytes) -> list[bytes]:
    """The keys whose values contain `needle` (e.g. a message id), whatever format they are in."""
    return [key for key, c in content.items() if any(needle in v for v in c.values)]
