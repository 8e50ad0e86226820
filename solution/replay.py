"""Move dead-lettered messages from q:tasks:dlq back onto q:tasks, once.

Run it by hand after fixing the cause:   python replay.py [--limit N]
It handles the entries present when it starts and exits: it never waits for
new ones, because a DLQ consumer that replays automatically loops forever
while the cause remains.
"""
import argparse
import json
import os

import redis

QUEUE = "q:tasks"
DLQ = "q:tasks:dlq"


def rebuild(raw):
    """Return (message to requeue, None), or (None, why it cannot be replayed)."""
    try:
        record = json.loads(raw)
    except ValueError:
        return None, "not JSON"
    payload = record.get("payload") if isinstance(record, dict) else None
    if not isinstance(payload, dict):
        return None, "payload is not a message object"
    # A fresh series of retries: count from 0, and let the next failure set
    # its own first_seen_at.
    msg = {k: v for k, v in payload.items() if k != "first_seen_at"}
    msg["attempts"] = 0
    return msg, None


def replay_entry(r, index):
    """Move DLQ entry number `index` onto the queue; None once past the end.

    WATCH + MULTI/EXEC makes the remove-and-push one step: a crash leaves the
    entry either still in the DLQ or already on the queue, never lost or doubled.
    """
    with r.pipeline() as pipe:
        while True:
            try:
                pipe.watch(DLQ)
                raw = pipe.lindex(DLQ, index)
                if raw is None:
                    return None
                msg, reason = rebuild(raw)
                if msg is None:
                    return raw, None, reason  # leave it where it is for a human
                pipe.multi()
                pipe.lrem(DLQ, 1, raw)
                pipe.rpush(QUEUE, json.dumps(msg))
                pipe.execute()
                return raw, msg, None
            except redis.WatchError:
                continue  # the DLQ changed meanwhile (a worker added to it): look again


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, help="move at most N entries (default: all)")
    args = parser.parse_args()

    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
                             decode_responses=True)
    total = r.llen(DLQ)  # only what is there now: entries added later wait for the next run
    limit = total if args.limit is None else args.limit
    moved = skipped = 0
    while moved < limit and moved + skipped < total:
        # Skipped entries stay at the front of the list, so the next one is after them.
        result = replay_entry(r, skipped)
        if result is None:
            break
        raw, msg, reason = result
        if msg is None:
            skipped += 1
            print(f"left in {DLQ} ({reason}): {raw[:200]}")
        else:
            moved += 1
            print(f"replayed id={msg.get('id')} -> {QUEUE} attempts=0")
    print(f"moved {moved}, left {r.llen(DLQ)} in {DLQ}")


if __name__ == "__main__":
    main()
