"""How a check says "this step fails": raise CheckFailed with a message a learner can act on; or, when it
cannot tell, "this step was not graded": raise CannotJudge saying why."""
from __future__ import annotations

from typing import NoReturn

from retrylab import bidi, i18n

MESSAGE_LIMIT = 4000


class CheckFailed(Exception):
    """The learner's submission does not meet the step; the message says why."""

    def __init__(self, message: str):
        if len(message) > MESSAGE_LIMIT:
            notice = "\n" + i18n.label("verdict.shortened")   # in the language the message was built in
            message = bidi.truncate(message, MESSAGE_LIMIT - len(notice), "") + notice
        super().__init__(message)
        self.message = message


class CannotJudge(Exception):
    """The harness could not tell whether the submission meets the step (e.g. a machine too busy to time what
    the step times): the step is reported as not graded ("error"), with the message, never as a verdict."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def cannot_judge(message: str) -> NoReturn:
    raise CannotJudge(message)


def fail(message: str) -> NoReturn:
    raise CheckFailed(message)


def expect(condition: bool, message: str) -> None:
    if not condition:
        fail(message)


def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())
