"""`retrylab verify --step N DIR`: is step N done in the live lab environment? Read-only.

For lab platforms' check buttons: looks at the learner's files in DIR and the learner's own broker
(the exercise's broker: its live option) as they stand, never runs the learner's code and never writes to
that broker. Exit status 0 done, 1 not yet (with what is missing and the step's hint), 2 cannot check
(e.g. the broker does not answer).
It speaks the learner's language: `--lang`, else the locale, as `retrylab check`.
"""
from __future__ import annotations


from retrylab import i18n, options
from retrylab.commands import UsageError, add_options, chosen_exercise, given_path, write_stdout
from retrylab.verify import CannotCheck, render, verify


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="say whether one step is done in a live lab environment (read-only)",
        description="Inspect the learner's files and own broker as they stand, read-only, and say whether"
                    " step N is done. Exit status: 0 done, 1 not yet, 2 cannot check.")
    parser.add_argument("directory", type=given_path, help="the learner's directory, e.g. /root/qr")
    options.STEP.add_to(parser, action="store", default=None, required=True, help="the lab step to verify")
    for broker in live_brokers():   # no default here: the exercise's broker gives it (live_url)
        broker.live_option.add_to(parser, default=None,
                                  help=f"the learner's own server, only read from (default: {broker.live_default})")
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
        result = verify(args.directory, args.step, broker_url=live_url(args, exercise), exercise_id=exercise.id, lang=lang)
    except CannotCheck as exc:
        raise UsageError(i18n.label("verify.cannot_check", lang, step=args.step, reason=str(exc))) from None
    write_stdout(render(result))
    return 0 if result.done else 1


def live_brokers() -> list:
    """The brokers whose option names a learner's own server, one per flag (two brokers may share one)."""
    from retrylab import brokers
    found = {}
    for kind in options.broker_kinds():
        broker = brokers.get(kind)
        if broker.live_option is not None:
            found.setdefault(broker.live_option.flags, broker)
    return list(found.values())


def live_url(args, exercise) -> str:
    """The learner's server for the exercise's broker: as given, else the broker's default."""
    from retrylab import brokers
    broker = brokers.get(exercise.broker)
    given = getattr(args, broker.live_option.dest, None) if broker.live_option is not None else None
    return given or broker.live_default
