"""GitHub Actions: one error annotation per failed lab step, as workflow commands.

    ::error file=<learner's file>,line=<n>,title=<step>::<message>

Escaping follows the Actions toolkit (`@actions/core` command.ts): in the message `%`, `\\r`, `\\n`
become `%25`, `%0D`, `%0A`; property values also get `:` -> `%3A` and `,` -> `%2C`.

Where they go: the runner reads workflow commands from a step's stderr as well as its stdout
(actions/runner ScriptHandler.cs hands both streams to an OutputManager with the ActionCommandManager),
so `retrylab check` prints them on stderr and stdout keeps only the report (`--format exercism`
etc. stay machine-readable). A file given as an absolute path under the workspace is made relative
to the repository by the runner (IssueCommandExtension), so the CLI passes the submission's absolute
path. Titles and messages are in the report's language.

Also here: `inert_json`/`inert_xml`/`inert_text`, used by the reporters whose output may go to stdout in a
GitHub job. A check's message can quote the learner's files and output; a quoted `::stop-commands::x` at
the start of a line, or a legacy `##[error]` anywhere in one, would otherwise be obeyed by the runner.
Both rewrite only characters inside strings, as escapes that every parser decodes back.
"""
from __future__ import annotations

import posixpath
import re

from retrylab import i18n
from retrylab.reporters.bounds import bounded, default_message, language, neutral, utf8_safe
from retrylab.results import Report, StepResult

MESSAGE_LIMIT = 8000   # characters of an annotation's message; the step's full text is in the report


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(kind: str, message: str, *, file: str | None = None, line: int | None = None,
            title: str | None = None) -> str:
    """One workflow command line, e.g. `::error file=a.txt,line=3,title=t::message`."""
    properties = []
    if file:
        properties.append(f"file={escape_property(file)}")
        if line is not None and line >= 1:
            properties.append(f"line={line}")
    if title:
        properties.append(f"title={escape_property(title)}")
    head = f"::{kind} {','.join(properties)}" if properties else f"::{kind}"
    return f"{head}::{escape_data(utf8_safe(message))}\n"


def _label(result: StepResult, lang: str) -> str:
    what = (i18n.label("formats.step_title", lang, number=result.number, title=result.title)
            if not result.advanced else f"{result.name}: {result.title}")
    return f"retrylab {what}"


def _annotation(result: StepResult, submission_dir: str, lang: str) -> str:
    # Advanced checks do not change the lab's result: a warning, not an error.
    kind = "warning" if result.advanced else "error"
    file = line = None
    if result.location is not None:
        name, line = result.location
        file = posixpath.join(submission_dir, name)
    message = result.message or default_message(result, lang)
    # shown on a web page and in the job log: learner text escaped as in the text report
    return command(kind, bounded(neutral(message), MESSAGE_LIMIT, "message", lang=lang), file=file, line=line,
                   title=_label(result, lang))


def render(report: Report, submission_dir: str | None = None) -> str:
    """The annotations for `report` (empty when everything passed). `submission_dir` is where the
    learner's files are, best absolute (default: the report's submission path as given)."""
    root = submission_dir if submission_dir is not None else report.submission
    lang = language(report)
    lines = [_annotation(r, root, lang) for r in report.results if not r.passed]
    if report.harness_error:
        lines.append(command("error", neutral(report.harness_error), title=i18n.label("formats.could_not_grade", lang)))
    return "".join(lines)


# --------------------------------------------------------------------------------------------
# keeping learner text in a machine-readable report from acting as a workflow command

_LINE_START_COMMAND = re.compile(r"^(\s*)::", re.MULTILINE)


def inert_json(serialized: str) -> str:
    """Serialized JSON in which no learner text can act as a workflow command. JSON escapes line
    breaks inside strings, so only the legacy `##[` (matched anywhere in a line) needs care."""
    return serialized.replace("##[", "\\u0023#[")


_WORD_JOINER = "\u2060"   # invisible, and no line break: a reader sees the text as it was


def inert_text(text: str) -> str:
    """Human text in which no line starts with `::` and none holds `##[`: a word joiner goes between
    the two characters (the text report is read, not parsed back, so it need not decode)."""
    text = text.replace("##[", f"#{_WORD_JOINER}#[")
    return _LINE_START_COMMAND.sub(rf"\1:{_WORD_JOINER}:", text)


def inert_xml(serialized: str) -> str:
    """Serialized XML in which no line starts with `::` and none holds `##[`. The caller has turned
    raw carriage returns in text into line feeds (the runner splits lines at both)."""
    serialized = serialized.replace("##[", "&#35;#[")
    return _LINE_START_COMMAND.sub(r"\1&#58;:", serialized)
