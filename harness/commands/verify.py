"""`retrylab verify --step N DIR`: is step N done in the live lab environment? Read-only.

For lab platforms' check buttons: looks at the learner's files in DIR and the learner's own Redis
as they stand, never runs the learner's code and never writes to that Redis. Exit status 0 done,
1 not yet (with what is missing and the step's hint), 2 cannot check (e.g. Redis does not answer).
It speaks the learner's language: `--lang`, else the locale, as `retrylab check`.
"""
from __future__ import annotations

import sys
from pathlib import Path

from retrylab import i18n, options
from retrylab.commands import UsageError, add_options, chosen_exercise
from retrylab.verify import DEFAULT_REDIS_URL, CannotCheck, render, verify


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="say whether one step is done in a live lab environment (read-only)",
        description="Inspect the learner's files and own Redis as they stand, read-only, and say whether"
                    " step N is done. Exit status: 0 done, 1 not yet, 2 cannot check.")
    parser.add_argument("directory", type=Path, help="the learner's directory, e.g. /root/qr")
    options.STEP.add_to(parser, action="store", default=None, required=True, help="the lab step to verify")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL, metavar="URL",
                        help=f"the learner's Redis, only read from (default: {DEFAULT_REDIS_URL})")
    add_options(parser, options.EXERCISE, options.LANG)


def run(args) -> int:
    lang = i18n.resolve(args.lang)
    if not args.directory.is_dir():
        raise UsageError(i18n.label("verify.not_a_directory", lang, path=str(args.directory)))
    exercise = chosen_exercise(args)
    known = sorted(s.number for s in exercise.steps)
    if args.step not in known:
        raise UsageError(i18n.label("explain.unknown", lang, step=args.step, exercise=exercise.id,
                                    first=known[0], last=known[-1]))
    try:
        result = verify(args.directory, args.step, redis_url=args.redis_url, exercise_id=exercise.id, lang=lang)
    except CannotCheck as exc:
        raise UsageError(i18n.label("verify.cannot_check", lang, step=args.step, reason=str(exc))) from None
    sys.stdout.write(render(result))
    return 0 if result.done else 1
