"""Consume q:tasks; retry failures later with capped full-jitter backoff; after 5 failed
attempts (or at once, for an error no retry can fix) move the message to q:tasks:dlq with what is
needed to investigate it. Runs until SIGTERM / Ctrl-C, finishing the message in hand first.

Run:  REDIS_URL=redis://host:6379/0 python worker.py
Settings (environment): RETRY_MAX_ATTEMPTS=5  RETRY_BACKOFF_BASE=1  RETRY_BACKOFF_CAP=30
                        WORKER_HEARTBEAT_TTL=30  LOG_LEVEL=INFO (DEBUG logs every message)
The machinery is in retryqueue/ (start with retryqueue/worker.py).
"""
import logging
import os
import sys

import redis

from retryqueue.worker import Settings, Worker


def main():
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO").upper(), stream=sys.stdout,
                        format="%(asctime)s %(message)s")
    sys.path.append("/opt/app")  # the lab machine's application module
    from taskproc import process

    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    Worker(r, process, Settings.from_env()).run()


if __name__ == "__main__":
    main()
