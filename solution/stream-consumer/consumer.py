"""Consume stream `orders` in consumer group `workers`: apply each entry's effect once, retry a failed
entry after a growing idle time, and move it to `orders:dlq` after its 3rd delivery.
Runs until SIGTERM or Ctrl-C, finishing the entry in hand first.

Run:  REDIS_URL=redis://host:6379/0 python consumer.py
"""
import os
import signal
import socket

import redis

import effects  # the lab's application module: effects.apply(fields) performs the side effect

STREAM, GROUP, DLQ = "orders", "workers", "orders:dlq"
MAX_DELIVERIES = 3          # the 3rd failed delivery moves the entry to the DLQ
RETRY_IDLE_MS = 200         # idle time before the 1st reclaim; doubled for each delivery after it (200, 400)
DONE_TTL = 7 * 24 * 3600    # how long an applied order is remembered: longer than any redelivery can take
# a name per host and process; a restarted consumer does not rely on getting its old name back: reclaim()
# takes any consumer's entries once they have been idle long enough, its own dead predecessor's included
CONSUMER = f"{socket.gethostname()}-{os.getpid()}"

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"), decode_responses=True)
stopping = False


def ensure_group():
    """Create the group from the stream's start (id 0: entries added before we started count too)."""
    try:
        r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def handle(entry_id, fields, deliveries):
    """Apply the entry once, then XACK it; on failure leave it pending (reclaimed later) or dead-letter it."""
    done_key = f"orders:done:{fields.get('order_id', entry_id)}"
    # The idempotency key is recorded BEFORE the effect: if the process dies between the effect and
    # the XACK, the redelivered entry finds the key and is only acknowledged.
    if r.set(done_key, entry_id, nx=True, ex=DONE_TTL):
        try:
            effects.apply(fields)
        except Exception as exc:  # noqa: BLE001 - any failure of the effect is retried, then dead-lettered
            r.delete(done_key)    # not applied: a retry must be free to apply it
            if deliveries >= MAX_DELIVERIES:
                dead_letter(entry_id, fields, exc, deliveries)
            return                # still pending: reclaim() takes it again once it has been idle long enough
    r.xack(STREAM, GROUP, entry_id)


def dead_letter(entry_id, fields, exc, deliveries):
    with r.pipeline() as tx:  # MULTI/EXEC: the dead letter and the XACK together, never one without the other
        tx.xadd(DLQ, {**fields, "error": f"{type(exc).__name__}: {exc}", "deliveries": deliveries,
                      "source_id": entry_id})
        tx.xack(STREAM, GROUP, entry_id)
        tx.execute()


def reclaim():
    """Take back entries whose consumer failed them (or died): each waits longer than the last time."""
    for pending in r.xpending_range(STREAM, GROUP, "-", "+", 100, idle=RETRY_IDLE_MS):
        wait_ms = RETRY_IDLE_MS * 2 ** (pending["times_delivered"] - 1)
        if pending["time_since_delivered"] < wait_ms:
            continue
        # XCLAIM's min-idle makes the claim safe against another consumer claiming it meanwhile
        for entry_id, fields in r.xclaim(STREAM, GROUP, CONSUMER, wait_ms, [pending["message_id"]]):
            if fields:    # an entry deleted from the stream comes back empty: nothing to apply
                handle(entry_id, fields, pending["times_delivered"] + 1)
            else:
                r.xack(STREAM, GROUP, entry_id)


def stop(*_):
    global stopping
    stopping = True


def main():
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ensure_group()
    while not stopping:
        reclaim()
        # a short BLOCK: reclaim() runs at least every 100 ms even when nothing new arrives
        for _, entries in r.xreadgroup(GROUP, CONSUMER, {STREAM: ">"}, count=10, block=100) or []:
            for entry_id, fields in entries:
                handle(entry_id, fields, 1)


if __name__ == "__main__":
    main()
