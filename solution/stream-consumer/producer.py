"""Add N orders to stream `orders` without letting the consumers fall more than --max-lag behind.

Policy: block. Before each XADD the producer waits while the group's lag (undelivered + pending) is at
--max-lag or more, so nothing is lost and nothing is refused: the caller is slowed instead.

Run:  REDIS_URL=redis://host:6379/0 python producer.py --count 100 --max-lag 20
"""
import argparse
import os
import time
import uuid

import redis

from lag import lag   # one definition of lag for the metric and for the policy

STREAM = "orders"
POLL = 0.02           # seconds between two looks at the lag while blocked

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"), decode_responses=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--max-lag", type=int, required=True)
    args = parser.parse_args()
    print("policy=block", flush=True)
    blocked = 0.0
    for n in range(args.count):
        started = time.monotonic()
        while lag() >= args.max_lag:
            time.sleep(POLL)
        blocked += time.monotonic() - started
        r.xadd(STREAM, {"order_id": uuid.uuid4().hex, "kind": "ok", "priority": "normal", "seq": n})
    print(f"added={args.count} refused=0 blocked_s={blocked:.2f}", flush=True)


if __name__ == "__main__":
    main()
