"""The `retrylab` subcommands: one module each, with `register(subparsers)` and `run(args) -> int`.

A subcommand raises `UsageError` (exit status 2, one line on stderr) when it cannot do its job for a
reason outside the learner's submission: bad arguments, a backend that is not available here.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path

from retrylab import exercise as exercises
from retrylab import options


class UsageError(Exception):
    pass


class OutputError(UsageError):
    """Standard output could not take what the command had to say."""


def write_stdout(text: str, out=None, *, utf8: bool = False) -> None:
    """Write `text` on standard output (or `out`, a stream standing for it), now (flushed). Standard output that
    cannot take it (a full disk, a closed descriptor, a pipe whose reader left) is one line and exit status 2, as any
    other reason the command could not do its job: it was a traceback and exit status 1, which CI reads as a failed
    lab step. (What stays buffered is dealt with where the process ends: entry.main.)

    `utf8`: in UTF-8 whatever the locale, for a machine's report (JSON, or XML that says it is UTF-8): under a
    Latin-1 locale a learner's "café" was the byte 0xE9 in it, and the reader refused the whole report."""
    out = sys.stdout if out is None else out
    try:
        if out is None:     # started with descriptor 1 closed
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        if utf8 and hasattr(out, "buffer"):
            out.flush()
            data = memoryview(text.encode("utf-8", "backslashreplace"))
            while data:     # unbuffered (PYTHONUNBUFFERED), a write to a pipe may take only part
                written = out.buffer.write(data)
                if not written:     # a non-blocking descriptor that is full: not waited on in a loop
                    raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
                data = data[written:]
            out.buffer.flush()
            return
        out.write(text)
        out.flush()
    except OSError as exc:
        raise OutputError(f"could not write on standard output: {exc.strerror or exc}") from None


def given_path(text: str) -> Path:
    """A path argument (argparse type). An empty one is refused: Path("") is the current folder, so
    `retrylab check "$SUBMISSION"` with the variable unset graded whatever folder the job ran in."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path (an unset variable?): name the folder or file")
    return Path(text)


def check_seconds(flag: str, value: float | None) -> None:
    """A time limit given on the command line is usable (else UsageError)."""
    problem = options.seconds_problem(flag, value)
    if problem:
        raise UsageError(problem)


# The order is the order of `retrylab --help`.
COMMANDS = ["check", "verify", "grade-batch", "explain", "watch"]


def add_options(parser, *declared: options.Option) -> None:
    """Options declared once (retrylab.options), as this command takes them."""
    for option in declared:
        option.add_to(parser)


def chosen_exercise(args) -> exercises.Exercise:
    """The exercise `--exercise` names (args.exercise becomes its id); an unknown one: one line, exit 2."""
    exercise = exercises.get(args.exercise)
    args.exercise = exercise.id
    return exercise


def broker_settings(args, exercise: exercises.Exercise) -> dict:
    """The values of the exercise's broker's own options, by dest, as the command was given them."""
    from retrylab import brokers
    return {option.dest: getattr(args, option.dest, None) for option in brokers.get(exercise.broker).options}


def probe_backend(args, exercise: exercises.Exercise, *, private: bool = False) -> None:
    """args.backend becomes one the exercise's broker offers (its default when none was named; one
    line and exit 2 for another), then is probed: a backend that cannot work here is said now, in one
    line, rather than as a failed grading later. `private`: only backends with servers of their own."""
    from retrylab import brokers
    try:
        args.backend = options.chosen_backend(args.backend, exercise, private=private)
    except options.OptionError as exc:
        raise UsageError(str(exc)) from None
    brokers.get(exercise.broker).make_backend(args.backend, **broker_settings(args, exercise)).probe()


def start_early(args, exercise: exercises.Exercise) -> None:
    """Start the grading's servers and warm learner template now, in the background, so that they start while
    pytest is imported and the checks are collected rather than after (the grading takes them; brokers.stop_unused
    stops servers it did not take). Called before any thread starts, so the servers may be forked from here."""
    from retrylab import brokers, sandbox
    broker = brokers.get(exercise.broker)
    brokers.start_early(exercise.broker, args.backend, fork_servers=True, **broker_settings(args, exercise))
    sandbox.prepare(broker.learner_imports, broker.warm_imports)
