"""How deep is each part of the queue, and how old is the oldest work: for alerts and dashboards.

A DLQ fills quietly: nothing fails loudly when a message lands there, so someone finds it weeks
later unless its depth is watched. Lag (how long the oldest work has waited) says more than
depth about whether workers keep up.
"""
import json
import time
from dataclasses import asdict, dataclass

from . import keys


@dataclass(frozen=True)
class Depths:
    queued: int                  # messages waiting in q:tasks
    delayed: int                 # retries parked until due
    in_flight: int               # messages held in workers' processing lists
    dead: int                    # entries in the DLQ
    workers: int                 # workers registered (alive or not yet recovered)
    oldest_queued_age: float     # seconds since the head of q:tasks was first seen (None: unknown)
    overdue: float               # seconds the most overdue retry is past its due time (0: none)
    oldest_dead_age: float       # seconds since the oldest DLQ entry failed for the last time

    def as_dict(self):
        return asdict(self)


def _timestamp(raw, *names):
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if isinstance(value, dict) and isinstance(value.get("payload"), dict):
        value = {**value["payload"], **value}
    for name in names:
        stamp = value.get(name) if isinstance(value, dict) else None
        if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
            return stamp / 1000 if stamp > 1e11 else stamp  # epoch milliseconds
    return None


def measure(r, now=None):
    now = time.time() if now is None else now
    worker_ids = [w.decode() for w in r.smembers(keys.WORKERS)]
    with r.pipeline(transaction=False) as pipe:
        pipe.llen(keys.QUEUE)
        pipe.zcard(keys.DELAYED)
        pipe.llen(keys.DLQ)
        pipe.lindex(keys.QUEUE, 0)
        pipe.zrange(keys.DELAYED, 0, 0, withscores=True)
        pipe.lindex(keys.DLQ, 0)
        for worker_id in worker_ids:
            pipe.llen(keys.processing(worker_id))
        queued, delayed, dead, head, first_due, oldest_dead, *in_flight = pipe.execute()
    # A fresh message carries no time of its own unless its producer stamped one.
    first_seen = head and _timestamp(head, "first_seen_at", "enqueued_at", "created_at")
    failed = oldest_dead and _timestamp(oldest_dead, "last_failed_at", "first_seen_at")
    return Depths(
        queued=queued, delayed=delayed, in_flight=sum(in_flight), dead=dead, workers=len(worker_ids),
        oldest_queued_age=round(now - first_seen, 3) if first_seen else None,
        overdue=round(max(0.0, now - first_due[0][1]), 3) if first_due else 0.0,
        oldest_dead_age=round(now - failed, 3) if failed else None)


def dlq_alert(dead, threshold=0):
    """(exit status, line): 1 when the DLQ holds more than `threshold` entries."""
    if dead > threshold:
        return 1, f"ALERT: {keys.DLQ} depth={dead} > threshold={threshold}: run replay.py --dry-run to see them"
    return 0, f"OK: {keys.DLQ} depth={dead} (threshold={threshold})"
