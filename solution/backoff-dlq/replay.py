"""Move dead letters from q:tasks:dlq back onto q:tasks with attempts reset to 0, once.

Run it by hand after fixing the cause; it handles the entries present when it starts and exits.

    python replay.py                       # every entry
    python replay.py --dry-run             # show what would move, move nothing
    python replay.py --id ID [--id ID2]    # only these message ids
    python replay.py --match TEXT          # only entries whose JSON contains TEXT (e.g. an error)
    python replay.py --limit N             # at most N entries
"""
import argparse
import os

import redis

from retryqueue.keys import DLQ
from retryqueue.replay import Selection, describe, replay


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="show what would be moved; move nothing")
    parser.add_argument("--id", action="append", default=[], metavar="ID",
                        help="replay only this message id (repeatable)")
    parser.add_argument("--match", default="", metavar="TEXT", help="replay only entries whose JSON contains TEXT")
    parser.add_argument("--limit", type=int, metavar="N", help="replay at most N entries")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 0:
        parser.error("--limit must be 0 or more")

    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    selection = Selection(ids=tuple(args.id), match=args.match, limit=args.limit)
    moved = 0
    for outcome in replay(r, selection, dry_run=args.dry_run):
        print(describe(outcome, args.dry_run))
        moved += outcome.moved or (args.dry_run and outcome.message is not None)
    verb = "would move" if args.dry_run else "moved"
    print(f"{verb} {moved}; {r.llen(DLQ)} left in {DLQ}")


if __name__ == "__main__":
    main()
