"""Options, each declared once: the `retrylab` commands (argparse) and the pytest plugin add the same
`Option`, so a flag's name, type, choices, default and help cannot drift between them."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]                  # ("--step-timeout",)
    help: str
    dest: str                               # the argparse dest of the commands (args.<dest>)
    pytest_dest: str = ""                   # pytest's dest when it must differ (pytest's namespace is shared)
    settings: dict = field(default_factory=dict)   # type, choices, default, metavar, action, ...

    def add_to(self, parser, **overrides) -> None:
        """Add to an argparse parser (a command); `overrides`: e.g. another default for one command."""
        parser.add_argument(*self.flags, dest=self.dest, help=self.help, **{**self.settings, **overrides})

    def add_to_pytest(self, group) -> None:
        group.addoption(*self.flags, dest=self.pytest_dest or self.dest, help=self.help, **self.settings)
