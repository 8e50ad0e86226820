"""Reading a private Redis's whole keyspace, bounded so hostile data cannot stall the harness or fill its memory.

Whatever the learner's code wrote, what crosses into the grading process is bounded: the first MAX_KEYS keys (by
name), the first MAX_ELEMENTS elements of each, each value cut to MAX_VALUE_BYTES, and MAX_TOTAL_BYTES in all. The
cutting is done by the server (a read-only script), so an oversized value never travels whole. A cut value is a
prefix of the real one, so it can only hide a match, never invent one: a check that looks for a message id or
parses a JSON entry sees less, and fails, it never passes on what was cut away. `KeyContent.truncated` says that a
key's values are incomplete and `sizes` gives each value's real length, for a check that wants to say "too large to
judge".
"""
from __future__ import annotations

from dataclasses import dataclass

import redis

MAX_KEYS = 1000
MAX_ELEMENTS = 1000
MAX_VALUE_BYTES = 64 * 1024
MAX_TOTAL_BYTES = 16 * 1024 * 1024

# KEYS in a script: only the first MAX_KEYS names (sorted) leave the server, however many keys there are.
_FIRST_KEYS = """
local keys = redis.call('KEYS', '*')
local limit = tonumber(ARGV[1])
if #keys <= limit then return keys end
table.sort(keys)
local first = {}
for i = 1, limit do first[i] = keys[i] end
return first
"""

# One key's values, read and cut on the server: {complete (1/0), size1, prefix1, size2, prefix2, ...}.
_VALUES = """
local key, kind = KEYS[1], ARGV[1]
local count, cut, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local items
if kind == 'list' then items = redis.call('LRANGE', key, 0, count - 1)
elseif kind == 'zset' then items = redis.call('ZRANGE', key, 0, count - 1)
elseif kind == 'set' then items = redis.call('SRANDMEMBER', key, count)
elseif kind == 'hash' then
  items = {}
  local cursor = '0'
  repeat
    local page = redis.call('HSCAN', key, cursor, 'COUNT', 100)
    cursor = page[1]
    for i = 1, #page[2] do if #items < 2 * count then items[#items + 1] = page[2][i] end end
  until cursor == '0' or #items >= 2 * count
elseif kind == 'string' then items = {redis.call('GETRANGE', key, 0, cut)}
elseif kind == 'stream' then
  items = {}
  for _, entry in ipairs(redis.call('XRANGE', key, '-', '+', 'COUNT', count)) do
    for i = 2, #entry[2], 2 do items[#items + 1] = entry[2][i] end
  end
else return {1} end
local out, used, complete = {1}, 0, 1
for i = 1, #items do
  local value = items[i]
  local size = string.len(value)
  if kind == 'string' then size = redis.call('STRLEN', key) end
  local take = math.min(size, cut, budget - used)
  if take < size then complete = 0 end
  if take <= 0 and size > 0 then break end
  out[#out + 1] = size
  out[#out + 1] = string.sub(value, 1, take)
  used = used + take
end
out[1] = complete
return out
"""


@dataclass(frozen=True)
class KeyContent:
    type: str
    length: int
    values: tuple[bytes, ...]   # list/zset/set members, hash fields and values, the string itself (first
                                # MAX_ELEMENTS, each cut to MAX_VALUE_BYTES)
    truncated: bool = False     # some value was cut, or left out for the total budget
    sizes: tuple[int, ...] = ()  # each value's real length in bytes


def _first_keys(client: redis.Redis) -> list[bytes]:
    # The usual case, few keys, with plain KEYS (polled often: a script per poll would cost the server more).
    # A key count can only grow by what a script adds in the moment between the two commands.
    if client.dbsize() <= MAX_KEYS:
        keys = client.keys("*")
    else:
        keys = client.eval(_FIRST_KEYS, 0, MAX_KEYS)
    return sorted(k.encode() if isinstance(k, str) else k for k in keys)[:MAX_KEYS]


def shape(client: redis.Redis) -> tuple:
    """Each key's type and length: cheap enough to poll every few milliseconds."""
    keys = _first_keys(client)
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
    budget = MAX_TOTAL_BYTES
    for key, kind, length in shape(client):
        values, sizes, complete = _values(client, key, kind, budget)
        budget -= sum(len(v) for v in values)
        elements = 1 if kind == "string" else int(length) * (2 if kind == "hash" else 1)
        truncated = not complete or len(values) < min(elements, 2 * MAX_ELEMENTS if kind == "hash" else MAX_ELEMENTS)
        result[key] = KeyContent(kind, int(length), values, truncated, sizes)
    return result


def _values(client: redis.Redis, key: bytes, kind: str, budget: int) -> tuple[tuple[bytes, ...], tuple[int, ...], bool]:
    if budget <= 0:
        return (), (), False
    try:
        reply = client.eval(_VALUES, 1, key, kind, MAX_ELEMENTS, MAX_VALUE_BYTES, budget)
    except redis.ResponseError:
        return (), (), True  # the key changed type between reading its type and its values
    values = tuple(v.encode() if isinstance(v, str) else v for v in reply[2::2])
    return values, tuple(int(n) for n in reply[1::2]), bool(reply[0])


def mentions(content: dict[bytes, KeyContent], needle: bytes) -> list[bytes]:
    """The keys whose values contain `needle` (e.g. a message id), whatever format they are in."""
    return [key for key, c in content.items() if any(needle in v for v in c.values)]
