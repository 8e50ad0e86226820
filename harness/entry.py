"""Where the `retrylab` command starts. Importing the CLI takes about 0.2 s, and a Ctrl-C or a SIGTERM in
that time must end as one during the grading does: one line saying so and exit 130, not a traceback.
So this module imports only the standard library before it has a handler in place."""
from __future__ import annotations

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
    print(f"retrylab: {said}", file=sys.stderr)
    return INTERRUPTED


def main() -> int:
    previous = signal.signal(signal.SIGTERM, terminate)   # kept until cli.main puts its own: no gap between them
    try:
        try:
            from retrylab import cli
            return cli.main()
        except KeyboardInterrupt:   # in the imports, or in the moment cli.main installs or restores its handler
            return interrupted()
    finally:
        signal.signal(signal.SIGTERM, previous)
