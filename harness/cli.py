"""The `retrylab` command: parses arguments and hands over to a subcommand module."""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

from retrylab import __version__
from retrylab import exercise as exercises
from retrylab import options
from retrylab.brokers import BackendUnavailable
from retrylab.commands import COMMANDS, UsageError
from retrylab.entry import interrupted, say, terminate


def _parser() -> tuple[argparse.ArgumentParser, dict, dict]:
    parser = options.argument_parser(prog="retrylab", description="Grade message-queue retry labs.")
    parser.add_argument("--version", action="version", version=f"retrylab {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=options.argument_parser)
    modules = {name: importlib.import_module(f"retrylab.commands.{name.replace('-', '_')}") for name in COMMANDS}
    for module in modules.values():
        module.register(subparsers)
    return parser, modules, subparsers.choices


def main(argv: list[str] | None = None) -> int:
    in_main_thread = threading.current_thread() is threading.main_thread()   # else signals are not ours
    previous = signal.signal(signal.SIGTERM, terminate) if in_main_thread else None
    args = None
    try:
        parser, modules, subcommands = _parser()   # imports every subcommand: a signal can come in it too
        args, extra = parser.parse_known_args(argv)
        if extra:  # the subcommand's own usage, not the top level's: `check mine --frobnicate`
            subcommands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
        return modules[args.command].run(args)
    except (UsageError, BackendUnavailable, exercises.UnknownExercise) as exc:
        say(f"retrylab: {exc}")
        return 2
    except KeyboardInterrupt:
        return interrupted(getattr(args, "lang", None))
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
