"""The `retrylab` subcommands: one module each, with `register(subparsers)` and `run(args) -> int`.

A subcommand raises `UsageError` (exit status 2, one line on stderr) when it cannot do its job for a
reason outside the learner's submission: bad arguments, a backend that is not available here.
"""


class UsageError(Exception):
    pass


# The order is the order of `retrylab --help`.
COMMANDS = ["check", "verify", "grade-batch", "explain", "watch"]
