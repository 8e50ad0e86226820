"""Text every reporter needs: lengths bounded with a visible notice, and strings any format can carry.

A learner's script can print anything (megabytes, ANSI colours, bytes that are not UTF-8), and a
check's message can quote it, so reporters never pass text through unbounded or unchecked. What a
reporter adds in words (the notice of what was left out) is in the report's language.
"""
from __future__ import annotations

import functools
import re

from retrylab import bidi, i18n


def language(report) -> str:
    """The language a report is in; English for one we do not have (e.g. a report read back from JSON)."""
    lang = getattr(report, "lang", None)
    return lang if lang in i18n.LANGUAGES else i18n.DEFAULT


def default_message(result, lang: str) -> str:
    """What a step that did not pass says when its check gave no message."""
    return i18n.label("formats.not_judged" if result.status == "error" else "formats.step_fails", lang)


def _notice(omitted: int, what: str, lang: str) -> str:
    """The line that stands for what was left out; `what` is "output" or "message"."""
    return "\n" + i18n.label(f"formats.omitted.{what}", lang, omitted=omitted) + "\n"


def utf8_safe(text: str) -> str:
    """`text` with any lone surrogate (an undecodable byte kept by `surrogateescape`) written as
    `\\udcXX`, so that it can be encoded as UTF-8 (json.dumps, XML and stderr would fail on it)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _size(text: str, utf8: bool) -> int:
    return len(text.encode("utf-8")) if utf8 else len(text)


def _cut(text: str, start: int, stop: int | None, utf8: bool) -> str:
    if not utf8:
        return text[start:stop]
    # Cut the UTF-8 bytes and drop a character split at either edge.
    return text.encode("utf-8")[start:stop].decode("utf-8", "ignore")


def bounded(text: str, limit: int, what: str = "output", *, utf8: bool = False, lang: str = i18n.DEFAULT) -> str:
    """`text` if it fits in `limit` characters (UTF-8 bytes with `utf8=True`); else its beginning and
    its end, each about half of what fits, around a notice (in `lang`) that says how much was left out.

    The end is kept as well as the beginning: a learner's script prints its traceback last and a
    check's message ends with the hint. The result always fits in `limit`.
    """
    size = _size(text, utf8)
    if size <= limit:
        return text
    # Room for the notice as it reads for the whole text's length; a smaller count can read longer
    # (another plural form), so the room shrinks by what a first try overran.
    reserve = _size(_notice(len(text), what, lang), utf8)
    while limit - reserve >= 2:
        kept = _around_notice(text, size, limit - reserve, what, utf8, lang)
        over = _size(kept, utf8) - limit
        if over <= 0:
            return kept
        reserve += over
    return _cut(text, 0, max(limit, 0), utf8)  # no room for a notice


def _around_notice(text: str, size: int, room: int, what: str, utf8: bool, lang: str) -> str:
    head = _cut(text, 0, room - room // 2, utf8)
    tail = _cut(text, size - room // 2, None, utf8) if room // 2 else ""
    # Whole lines where that costs at most half of each part.
    cut = head.rfind("\n", len(head) // 2)
    head = head[:cut] if cut > 0 else head
    cut = tail.find("\n", 0, len(tail) // 2)
    tail = tail[cut + 1:] if cut >= 0 else tail
    omitted = len(text) - len(head) - len(tail)
    # the run's own notice of what it dropped (megabytes, where this cut leaves hundreds of characters) is kept
    dropped = _not_shown(lang).findall(text, len(head), len(text) - len(tail))[:_KEPT_NOTICES]
    return head + _notice(omitted, what, lang) + "".join(line + "\n" for line in dropped) + tail


_KEPT_NOTICES = 3     # a message quoting several runs' output has one notice per run


@functools.lru_cache(maxsize=None)
def _not_shown(lang: str) -> re.Pattern:
    """A whole line that is the sandbox's notice of output it did not keep (sandbox.CappedBuffer: `run.not_shown`)
    in `lang`, whatever its count (every plural form)."""
    forms = set()
    for count in (1, 2, 5, 21, 987654321):
        text = re.escape(i18n.label("run.not_shown", lang, count=count))
        forms.add(text.replace(re.escape(str(count)), r"\d+"))
    return re.compile("^(?:" + "|".join(sorted(forms)) + ")$", re.MULTILINE)


# Characters that act on a terminal or on the layout rather than show: C0 controls but line feed and
# tab, DEL, C1 controls, the bidi embeddings and overrides (the harness itself isolates with FSI ... PDI
# only, and marks a line's direction with LRM), the line and paragraph separators, and the
# interlinear annotation controls.
_ACTIVE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066\u2067\u2028\u2029\ufff9-\ufffb]")
# The directional marks LRM, RLM and ALM: each turns the direction of the text around it. The harness
# writes only LRM, and only as a line's first character after its indentation (i18n.ltr_lines: a plot's
# rows left to right in a Persian report); every other mark is learner text.
_MARKS = re.compile("[\u200e\u200f\u061c]")


def _escape(match: re.Match) -> str:
    char = match.group()
    code = ord(char)
    return {"\r": "\\r", "\b": "\\b", "\x1b": "\\x1b"}.get(char) or (
        f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _learners_marks(line: str) -> str:
    """`line` with its directional marks escaped, but for the harness's own LRM (see _MARKS)."""
    start = len(line) - len(line.lstrip(" "))
    if line.startswith(bidi.LRM, start):
        start += 1
    return line[:start] + _MARKS.sub(_escape, line[start:])


def neutral(text: str) -> str:
    """`text` for a terminal or a page of human text: every character that would act rather than show
    (ESC sequences that move the cursor or repaint a line, a lone CR that returns to the line's start,
    backspace, bidi overrides, a learner's directional marks) written as a visible escape (`\\x1b`,
    `\\r`, `\\u202e`, `\\u200f`). A learner's script or data could otherwise paint a passing verdict
    over the real one. A CR LF pair is a line end, as a CRLF file's lines are quoted."""
    text = text.replace("\r\n", "\n")
    if _ACTIVE.search(text):
        text = _ACTIVE.sub(_escape, text)
    if _MARKS.search(text):
        escaped = "\n".join(_learners_marks(line) for line in text.split("\n"))
        text = escaped if escaped != text else text   # unchanged text stays the very same string
    return text
