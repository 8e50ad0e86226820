"""The `retrylab` command: parses arguments and hands over to a subcommand module."""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

from retrylab import __version__, i18n
from retrylab import exercise as exercises
from retrylab.brokers import BackendUnavailable
from retrylab.commands import COMMANDS, UsageError

INTERRUPTED = 130   # as a shell reports a command ended by SIGINT


def _parser() -> tuple[argparse.ArgumentParser, dict, dict]:
    parser = argparse.ArgumentParser(prog="retrylab", description="Grade message-queue retry labs.")
    parser.add_argument("--version", action="version", version=f"retrylab {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    modules = {name: importlib.import_module(f"retrylab.commands.{name.replace('-', '_')}") for name in COMMANDS}
    for module in modules.values():
        module.register(subparsers)
    return parser, modules, subparsers.choices


def _terminate(signum, frame):
    # A CI job being cancelled (SIGTERM) unwinds like Ctrl-C: the learner's processes, private
    # servers and temporary copies are removed on the way out (the default action would kill us first)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser, modules, subcommands = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's own usage, not the top level's: `check mine --frobnicate`
        subcommands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    in_main_thread = threading.current_thread() is threading.main_thread()   # else signals are not ours
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main_thread else None
    try:
        return modules[args.command].run(args)
    except (UsageError, BackendUnavailable, exercises.UnknownExercise) as exc:
        print(f"retrylab: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"retrylab: {i18n.label('grading.interrupted', i18n.resolve(getattr(args, 'lang', None)))}",
              file=sys.stderr)
        return INTERRUPTED
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
