"""`retrylab verify --step N DIR`: is step N done in the live lab environment? Read-only.

For lab platforms' check buttons: looks at the learner's files in DIR and the learner's own Redis
as they stand, never runs the learner's code and never writes to that Redis. Exit status 0 done,
1 not yet (with what is missing and the step's hint), 2 cannot check (e.g. Redis does not answer).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from retrylab import exercise as exercises
from retrylab.commands import UsageError
from retrylab.verify import DEFAULT_REDIS_URL, CannotCheck, render, verify


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="say whether one step is done in a live lab environment (read-only)",
        description="Inspect the learner's files and own Redis as they stand, read-only, and say whether"
                    " step N is done. Exit status: 0 done, 1 not yet, 2 cannot check.")
    parser.add_argument("directory", type=Path, help="the learner's directory, e.g. /root/qr")
    parser.add_argument("--step", type=int, required=True, metavar="N", help="the lab step to verify")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL, metavar="URL",
                        help=f"the learner's Redis, only read from (default: {DEFAULT_REDIS_URL})")
    parser.add_argument("--exercise", default=exercises.DEFAULT_EXERCISE, help=argparse.SUPPRESS)


def run(args) -> int:
    if not args.directory.is_dir():
        raise UsageError(f"{args.directory} is not a directory")
    exercise = exercises.get(args.exercise)
    known = sorted(s.number for s in exercise.steps)
    if args.step not in known:
        raise UsageError(f"no step {args.step} in {exercise.id} (steps are {known[0]}-{known[-1]})")
    try:
        result = verify(args.directory, args.step, redis_url=args.redis_url, exercise_id=exercise.id)
    except CannotCheck as exc:
        raise UsageError(f"cannot check step {args.step}: {exc}") from None
    sys.stdout.write(render(result))
    return 0 if result.done else 1
