"""Show queue depth and lag: queued, delayed retries, in flight, DLQ, and how old the oldest work is.

    python status.py           # one line per figure
    python status.py --json    # one JSON object, for a metrics collector
"""
import argparse
import json
import os

import redis

from retryqueue.monitor import measure

LABELS = {
    "queued": "q:tasks depth", "delayed": "delayed retries", "in_flight": "in flight",
    "dead": "q:tasks:dlq depth", "workers": "workers registered",
    "oldest_queued_age": "oldest queued message age (s)", "overdue": "most overdue retry (s)",
    "oldest_dead_age": "oldest DLQ entry age (s)",
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    depths = measure(r).as_dict()
    if args.json:
        print(json.dumps(depths))
        return
    for name, value in depths.items():
        print(f"{LABELS[name] + ':':32} {'unknown' if value is None else value}")


if __name__ == "__main__":
    main()
