"""Retries that wait without blocking the queue.

Sleeping in the worker before requeueing a failed message holds up every message behind it for
the whole backoff. Instead, the failed message is parked in a sorted set scored by the time it
is due, and the worker carries on with the queue. Due messages are moved back to the tail of
the queue by a Lua script: the check and the move are one atomic step, so two workers
promoting at once cannot both move (and duplicate) the same message.

Due times come from the worker's clock (time.time()), not Redis's: all workers must agree on
the time (NTP), which they need to anyway for first_seen_at to mean anything.
"""
from . import keys, lua

# KEYS: delayed set, queue. ARGV: now, most to move. Returns {moved, score of the next one or false}.
PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, message in ipairs(due) do
  redis.call('ZREM', KEYS[1], message)
  redis.call('RPUSH', KEYS[2], message)
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {#due, nxt[2] or false}
"""
BATCH = 100  # bounded work per call: a backlog of due retries is moved a slice at a time


# KEYS: delayed set, processing list. ARGV: the message as taken, the message to retry, due time.
# Parking the retry and letting go of the message taken are one step: never both, never neither.
PARK = """
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('LREM', KEYS[2], 1, ARGV[1])
"""


class DelayedRetries:
    def __init__(self, r):
        self._promote = lua.script(r, PROMOTE)
        self._park = lua.script(r, PARK)

    def park(self, processing, raw, retry, due):
        """Replace the in-flight message `raw` by `retry`, due back on the queue at `due` (epoch s)."""
        self._park(keys=[keys.DELAYED, processing], args=[raw, retry, repr(float(due))])

    def promote(self, now):
        """Move due retries to the queue; return (how many moved, due time of the next or None)."""
        moved, nxt = self._promote(keys=[keys.DELAYED, keys.QUEUE], args=[repr(float(now)), BATCH])
        return int(moved), (float(nxt) if nxt else None)
