"""The `retrylab` command: parses arguments and hands over to a subcommand module."""
from __future__ import annotations

import argparse
import importlib
import sys

from retrylab import __version__
from retrylab import exercise as exercises
from retrylab.backends import BackendUnavailable
from retrylab.commands import COMMANDS, UsageError


def _parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="retrylab", description="Grade message-queue retry labs.")
    parser.add_argument("--version", action="version", version=f"retrylab {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    modules = {name: importlib.import_module(f"retrylab.commands.{name.replace('-', '_')}") for name in COMMANDS}
    for module in modules.values():
        module.register(subparsers)
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = _parser()
    args = parser.parse_args(argv)
    try:
        return modules[args.command].run(args)
    except (UsageError, BackendUnavailable, exercises.UnknownExercise) as exc:
        print(f"retrylab: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
