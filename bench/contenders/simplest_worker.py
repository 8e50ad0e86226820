"""The simplest lab-level worker, the benchmark's upper bound: BLPOP, process, RPUSH on failure.

One round trip per message and nothing else: no retry delay, no reliable fetch (a crash loses the
message in hand), no heartbeat. Retries go straight back to the tail with attempts + 1; the
fifth failure goes to the DLQ.
"""
import json
import os
import sys

import redis

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "standin"))
from taskproc import process  # noqa: E402

r = redis.Redis.from_url(os.environ["REDIS_URL"])
r.sadd("bench:ready", os.getpid())
while True:
    popped = r.blpop(["q:tasks"], timeout=1)
    if popped is None:
        continue
    msg = json.loads(popped[1])
    try:
        process(msg)
    except Exception as exc:
        msg["attempts"] = msg.get("attempts", 0) + 1
        if msg["attempts"] >= 5:
            r.rpush("q:tasks:dlq", json.dumps({"payload": msg, "error": str(exc), "attempts": msg["attempts"]}))
        else:
            r.rpush("q:tasks", json.dumps(msg))
