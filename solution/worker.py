"""Consume q:tasks forever; retry failures with capped full-jitter backoff,
give up after 5 attempts into q:tasks:dlq with what is needed to investigate.

Run: REDIS_URL=redis://host:6379/0 python worker.py
Importing this module connects to nothing (make_outputs.py reuses requeue()).
"""
import json
import os
import sys
import time

import redis

from backoff import capped, exponential, full_jitter

QUEUE = "q:tasks"
DLQ = "q:tasks:dlq"
MAX_ATTEMPTS = 5
# Keys the worker adds to a message to count retries; not part of what the
# producer sent, so the DLQ record's payload leaves them out.
BOOKKEEPING = ("attempts", "first_seen_at")
POLICY = full_jitter(capped(exponential(1.0), 30.0))


def describe(exc):
    # The class name tells timeout from bug; the text says which task and why.
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def requeue(msg, first_seen_at, push, sleep=time.sleep, policy=POLICY, log=print):
    """Wait, then put `msg` back on the queue with one more attempt counted.

    `push(key, text)` is redis' rpush in the worker and a plain list in
    make_outputs.py, so the file it writes shows this very function at work.
    """
    attempts = msg.get("attempts", 0) + 1
    # `attempts` failures so far; the first retry uses schedule entry 0 (up to 1 s).
    wait = policy(attempts - 1)
    sleep(wait)
    # The count and the first-seen time travel inside the message: the next
    # delivery (to this worker or another) carries on from them.
    push(QUEUE, json.dumps({**msg, "attempts": attempts, "first_seen_at": first_seen_at}))
    log(f"requeued id={msg.get('id')} attempts={attempts} wait={wait:.3f}")
    return attempts


def dead_letter(payload, error, attempts, first_seen_at, push, log=print):
    # The four things an operator needs later: what, why, how often, since when.
    record = {"payload": payload, "error": error,
              "attempts": attempts, "first_seen_at": first_seen_at}
    push(DLQ, json.dumps(record))
    log(f"dead-lettered attempts={attempts} error={error}")


def handle(raw, process, push, now):
    """Deliver one raw queue entry to process(); retry or dead-letter on failure."""
    try:
        msg = json.loads(raw)
        if not isinstance(msg, dict):
            raise ValueError(f"expected a JSON object, got {type(msg).__name__}")
    except ValueError as exc:
        # Retrying cannot fix a malformed message: straight to the DLQ, raw text kept.
        dead_letter(raw, f"invalid JSON message: {exc}", 1, now, push)
        return
    first_seen_at = msg.get("first_seen_at", now)  # set once, on the first attempt
    try:
        process(msg)
    except Exception as exc:  # any failure of the task must not kill the worker
        attempts = msg.get("attempts", 0) + 1
        if attempts >= MAX_ATTEMPTS:
            payload = {k: v for k, v in msg.items() if k not in BOOKKEEPING}
            dead_letter(payload, describe(exc), attempts, first_seen_at, push)
        else:
            requeue(msg, first_seen_at, push)


def main():
    # Imported here, not at the top, so make_outputs.py can import this module
    # on a machine without the application.
    sys.path.insert(0, "/opt/app")
    from taskproc import process

    sys.stdout.reconfigure(line_buffering=True)  # log lines appear as they happen
    url = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
    r = redis.Redis.from_url(url, decode_responses=True)
    while True:
        _, raw = r.blpop([QUEUE])  # no timeout: wait for the next message
        handle(raw, process, r.rpush, time.time())


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
