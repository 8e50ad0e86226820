"""Text every reporter needs: lengths bounded with a visible notice, and strings any format can carry.

A learner's script can print anything (megabytes, ANSI colours, bytes that are not UTF-8), and a
check's message can quote it, so reporters never pass text through unbounded or unchecked.
"""
from __future__ import annotations

_NOTICE = "\n[... {omitted} characters of {what} omitted ...]\n"


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


def bounded(text: str, limit: int, what: str = "output", *, utf8: bool = False) -> str:
    """`text` if it fits in `limit` characters (UTF-8 bytes with `utf8=True`); else its beginning and
    its end, each about half of what fits, around a notice that says how much was left out.

    The end is kept as well as the beginning: a learner's script prints its traceback last and a
    check's message ends with the hint. The result always fits in `limit`.
    """
    size = _size(text, utf8)
    if size <= limit:
        return text
    # Reserve room for the longest notice this text can need (the count can only be smaller).
    room = limit - _size(_NOTICE.format(omitted=len(text), what=what), utf8)
    if room < 2:
        return _cut(text, 0, max(limit, 0), utf8)
    head = _cut(text, 0, room - room // 2, utf8)
    tail = _cut(text, size - room // 2, None, utf8) if room // 2 else ""
    # Whole lines where that costs at most half of each part.
    cut = head.rfind("\n", len(head) // 2)
    head = head[:cut] if cut > 0 else head
    cut = tail.find("\n", 0, len(tail) // 2)
    tail = tail[cut + 1:] if cut >= 0 else tail
    omitted = len(text) - len(head) - len(tail)
    return head + _NOTICE.format(omitted=omitted, what=what) + tail
