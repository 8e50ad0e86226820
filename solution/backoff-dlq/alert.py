"""Alert on DLQ depth: exit 1 when q:tasks:dlq holds more than --threshold entries (default 0).

Run it from cron or a monitoring agent: a DLQ fills quietly, and nobody looks at it unless
something fails loudly.

    python alert.py [--threshold N]        # prints the depth; exit 0 OK, 1 alert
"""
import argparse
import os
import sys

import redis

from retryqueue.keys import DLQ
from retryqueue.monitor import dlq_alert


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=int, default=0, metavar="N",
                        help="alert when the DLQ holds more than N entries (default 0)")
    args = parser.parse_args(argv)
    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    status, line = dlq_alert(r.llen(DLQ), args.threshold)
    print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())
