"""Where the `retrylab` command starts. Importing the CLI takes about 0.2 s, and a Ctrl-C or a SIGTERM in
that time must end as one during the grading does: one line saying so and exit 130, not a traceback.
So this module imports only the standard library before it has a handler in place.

It is also where the process meets its standard descriptors: any the command was started without is filled
(/dev/null), what the user is told on stderr never fails the command, and what is left buffered for standard output
is written, or said to be lost, before Python's exit could fail on it."""
from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = 130   # as a shell reports a command ended by SIGINT


def terminate(signum, frame):
    """SIGTERM (a CI job being cancelled) unwinds like Ctrl-C: the default action would end the process before
    the learner's processes, private servers and temporary copies are removed."""
    raise KeyboardInterrupt


def interrupted(lang: str | None = None) -> int:
    """Says the grading was interrupted, in ``lang`` (``--lang``) or the environment's language."""
    try:
        from retrylab import i18n
        said = i18n.label("grading.interrupted", i18n.resolve(lang))
    except BaseException:   # a second signal, or an unknown language in the environment: the English line
        said = "interrupted: the grading was stopped (Ctrl-C or SIGTERM) before every step was checked"
    say(f"retrylab: {said}")
    return INTERRUPTED


def say(line: str) -> None:
    """One line on stderr for the user. A standard error that cannot take it (full, closed, its reader gone) changes
    nothing else: the exit status still says what happened."""
    if sys.stderr is None:      # print(file=None) would write it on standard output, into the report
        return
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _fill_standard_descriptors() -> None:
    """/dev/null on any of descriptors 0-2 the command was started without (`retrylab check ... >&-`): else the
    first file or socket the grading opens takes that number, and the servers it starts write their output into it.
    Python has made sys.stdout None for a closed descriptor 1 (write_stdout says so); stderr gets /dev/null too, as
    print() to a None stderr writes on standard output."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)   # the lowest free number: this one, as the lower ones are open
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - for the rest of the process


def _escape_what_cannot_be_encoded() -> None:
    """A character the output's encoding has not (`--lang zh` or a learner's non-ASCII line quoted, under
    PYTHONIOENCODING=ascii or a legacy locale) is written as an escape, not a UnicodeEncodeError traceback and exit 1
    after the grading. (A machine's report is written in UTF-8 whatever the locale: commands.write_stdout.)"""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _delivered(status: int) -> int:
    """`status`, once what is still buffered for standard output is written. A standard output that cannot take it
    (a full disk, a reader gone) makes it 2 with one line, and Python is not left to fail on it again at exit
    ("Exception ignored", status 120). After an interruption nothing more is written: a report cut short by Ctrl-C
    (a pager not reading) is dropped, not waited for."""
    if sys.stdout is None:
        return status
    try:
        if status != INTERRUPTED:
            sys.stdout.flush()
            return status
    except KeyboardInterrupt:
        status = interrupted()
    except (OSError, ValueError) as exc:
        if status != 2:             # 2: the command has said why already (write_stdout)
            say(f"retrylab: could not write on standard output: {getattr(exc, 'strerror', None) or exc}")
            status = 2
    _drop_stdout()
    return status


def _drop_stdout() -> None:
    """What is buffered for standard output goes nowhere, at exit too."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, sys.stdout.fileno())
        finally:
            os.close(null)
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def main() -> int:
    previous = signal.signal(signal.SIGTERM, terminate)   # kept until cli.main puts its own: no gap between them
    try:
        try:
            _fill_standard_descriptors()
            _escape_what_cannot_be_encoded()
            from retrylab import cli
            status = cli.main()
        except KeyboardInterrupt:   # in the imports, or in the moment cli.main installs or restores its handler
            status = interrupted()
        return _delivered(status)
    finally:
        signal.signal(signal.SIGTERM, previous)
