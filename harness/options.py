"""Options, each declared once: the `retrylab` commands (argparse) and the pytest plugin add the same
`Option`, so a flag's name, type, choices, default and help cannot drift between them.

The engine's options are below; a broker's own options (a server's address, say) are its
`Broker.options` (`broker_options()` gathers every broker's). `--backend` takes the backend names of
every broker: which of them the exercise's broker offers is known only once `--exercise` is parsed
(`chosen_backend`).
"""
from __future__ import annotations

import argparse
import pkgutil
from dataclasses import dataclass, field
from functools import cache

from retrylab import exercise as exercises
from retrylab import i18n


def argument_parser(**settings) -> argparse.ArgumentParser:
    """A parser of the commands: options spelled in full. argparse takes any unique prefix by default, so a mistyped
    or unknown option was read as another one (`grade-batch --step 3` set --step-timeout 3) instead of refused."""
    return argparse.ArgumentParser(allow_abbrev=False, **settings)


class OptionError(ValueError):
    """An option's value that cannot be used: one line, exit status 2."""


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]                  # ("--step-timeout",)
    help: str
    dest: str                               # the argparse dest of the commands (args.<dest>)
    pytest_dest: str = ""                   # pytest's dest when it must differ (pytest's namespace is shared)
    settings: dict = field(default_factory=dict)   # type, choices, default, metavar, action, ...

    def add_to(self, parser, **overrides) -> None:
        """Add to an argparse parser (a command); `overrides`: e.g. another default or help for one command."""
        parser.add_argument(*self.flags, dest=self.dest, **{"help": self.help, **self.settings, **overrides})

    def add_to_pytest(self, group) -> None:
        group.addoption(*self.flags, dest=self.pytest_dest or self.dest, help=self.help, **self.settings)


@cache
def broker_kinds() -> tuple[str, ...]:
    """Every broker kind: the packages under retrylab.brokers."""
    from retrylab import brokers
    return tuple(sorted(m.name for m in pkgutil.iter_modules(brokers.__path__) if m.ispkg))


def broker_options() -> tuple[Option, ...]:
    """Every broker's own options, once each (two brokers may share one)."""
    from retrylab import brokers
    found: dict[tuple[str, ...], Option] = {}
    for kind in broker_kinds():
        for option in brokers.get(kind).options:
            found.setdefault(option.flags, option)
    return tuple(found.values())


def _every_backend() -> list[str]:
    from retrylab import brokers
    return sorted({name for kind in broker_kinds() for name in brokers.get(kind).backends})


@cache
def backend_option() -> Option:
    """`--backend`: made when first added, as it asks every broker its backends (and a broker's
    package declares its options with this module)."""
    return Option(("--backend",), dest="backend", settings=dict(default=None, choices=_every_backend()),
                  help="the kind of private server the checks use, among those the exercise's broker offers"
                       " (default: the broker's embedded one, nothing to install)")


def chosen_backend(backend: str | None, exercise: exercises.Exercise, *, private: bool = False) -> str:
    """The backend to grade `exercise` with: `backend`, or its broker's default. `private`: only a
    backend that starts servers of its own (several gradings at once, each with its own)."""
    from retrylab import brokers
    broker = brokers.get(exercise.broker)
    offered = broker.private_backends if private else broker.backends
    if backend is None:
        return broker.default_backend
    if backend not in offered:
        raise OptionError(f"--backend {backend}: {exercise.id} is graded with one of {', '.join(offered)}")
    return backend


# The longest time limit taken: a day is more than any grading needs, and far beyond it (--step-timeout 1e10, inf)
# the deadlines overflowed the platform's time_t inside the grading, which then reported every step a harness defect
MAX_SECONDS = 24 * 3600


def seconds_problem(flag: str, value: float | None) -> str | None:
    """What is wrong with a time limit given as `flag` (None: nothing, or not given): above 0, at most a day."""
    if value is not None and not 0 < value <= MAX_SECONDS:
        return f"{flag} {value:g}: give a number of seconds above 0 and at most {MAX_SECONDS} (a day)"
    return None


# The engine's options, in the order `--help` shows them. A command adds those it takes.
EXERCISE = Option(("--exercise",), dest="exercise", pytest_dest="retrylab_exercise", settings=dict(
    default=None, metavar="ID"), help=f"the exercise to grade: {', '.join(exercises.exercises())} "
                                      f"(default: {exercises.default_id()})")
STEP = Option(("--step",), dest="step", pytest_dest="retrylab_steps", settings=dict(
    type=int, action="append", default=[], metavar="N"), help="grade only lab step N (repeatable)")
STEP_TIMEOUT = Option(("--step-timeout",), dest="step_timeout", pytest_dest="retrylab_step_timeout", settings=dict(
    type=float, default=None, metavar="SECONDS"),
    help="time limit of every step (default: each step's own, from exercise.toml)")
ISOLATION = Option(("--isolation",), dest="isolation", pytest_dest="retrylab_isolation", settings=dict(
    default="auto", choices=("auto", "required")),
    help="required: exit 2 unless learner code runs in namespaces of its own (bubblewrap or unshare);"
         " auto (default): as isolated as the machine allows")
LANG = Option(("--lang",), dest="lang", pytest_dest="retrylab_lang", settings=dict(
    default=None, choices=i18n.LANGUAGES),
    help="language of messages: en, zh, ru, fa (default: from LANGUAGE, LC_ALL, LC_MESSAGES, LANG; else en)")
