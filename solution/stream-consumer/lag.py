"""Print the consumer group's lag every 0.5 s, one `t,lag` line each (t: epoch seconds).

lag = entries not yet delivered to group `workers` + entries delivered but not yet acknowledged.
XLEN alone is not lag: it counts what was already consumed too.

Run:  REDIS_URL=redis://host:6379/0 python lag.py
"""
import os
import time

import redis

STREAM, GROUP = "orders", "workers"
INTERVAL = 0.5

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"), decode_responses=True)


def lag():
    try:
        groups = r.xinfo_groups(STREAM)
    except redis.ResponseError:   # no stream yet: nothing waits
        return 0
    group = next((g for g in groups if g["name"] == GROUP), None)
    if group is None:             # no group yet: every entry waits
        return r.xlen(STREAM)
    undelivered = group.get("lag")
    if undelivered is None:       # Redis cannot tell (after an XDEL): count what is past last-delivered-id
        undelivered = len(r.xrange(STREAM, "(" + group["last-delivered-id"], "+"))
    return undelivered + group["pending"]


def main():
    print("t,lag", flush=True)
    next_at = time.time()
    while True:
        print(f"{time.time():.3f},{lag()}", flush=True)
        next_at += INTERVAL
        time.sleep(max(0.0, next_at - time.time()))   # no drift: a slow read does not stretch the period


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
