"""Parsers for the files a learner writes in backoff-dlq: steps 2 (requeue.out), 3 (schedule.txt),
4 (jitter.txt) and 5 (capped.txt).

Each parser takes the file's raw bytes (``None`` when the file is missing), never raises, and returns
a :class:`Parsed`: the waits when the file is right, else one sentence that says what was expected,
what was seen (the offending line quoted through :func:`stored_values.shorten`, with its line number)
and how to fix it. Values are checked here too, not only the form.

Lenient (a careful grader accepts these, see README.md in this folder):
- LF, CRLF or CR line endings; a final newline or none; a UTF-8 byte-order mark;
- blank (whitespace-only) lines anywhere: skipped, but line numbers in messages are the editor's;
- leading/trailing whitespace on a line (including tabs and non-breaking spaces); any run of
  whitespace between ``attempt=<n>`` and ``wait=<s>``; spaces around ``=``;
- numbers as Python's ``float`` writes or reads them in ASCII: ``1``, ``1.0``, ``1.000``, ``1.``,
  ``.5``, ``8e0``, ``3.2E+1``, leading zeros; a leading ``+`` is accepted too: it is unambiguous
  and the value, not its spelling, is what the step is about. ``-`` parses, so that a negative wait
  is reported as negative rather than as "not a number";
- attempt numbers as ASCII integers (``attempt=00`` is attempt 0).

Strict (each rejected with its own message): a missing, empty, binary, UTF-16 or non-UTF-8 file;
another form than ``attempt=<n> wait=<s>`` in schedule.txt (upper-case keys, ``wait: 1``, CSV, JSON,
units such as ``1s``, decimal commas, extra words, comments); a wrong count of lines; attempts
numbered 1..N or out of order; NaN/inf; wrong values (the first one is named, with what it should
be and the formula); in capped.txt, a file that mixes bare numbers and ``attempt=…`` lines.

Huge inputs are cheap: lines are found by a C-level regex scan, at most a few more lines than
expected are parsed, counting stops at ``_COUNT_CAP``, and quoted text is shortened before it is
escaped.
"""
from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass
from typing import Iterator

from retrylab.checks.backoff_dlq import lab, stored_values
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.checks.backoff_dlq.stored_values import NUMBER, bounded, shorten

__all__ = [
    "CAPPED_WAITS",
    "JITTER_COUNT",
    "JITTER_MAX",
    "JITTER_MIN_DISTINCT",
    "Parsed",
    "SCHEDULE_WAITS",
    "parse_capped",
    "parse_jitter",
    "parse_schedule",
    "requeue_out_shows_attempts",
    "waits_by_line",
]

# The lab's backoff (lab.py), as whole seconds: that is how the files write them and the messages show them
SCHEDULE_WAITS = tuple(int(lab.exponential(n)) for n in range(6))  # 1 2 4 8 16 32: 1 s * 2**n, n = 0..5
CAPPED_WAITS = tuple(int(lab.capped(n)) for n in range(9))  # 1 2 4 8 16 30 30 30 30: min(30, 1 s * 2**n)
CAP = int(lab.BACKOFF_CAP)
JITTER_COUNT = 20
JITTER_MAX = int(lab.capped(3))  # 8: min(cap, 1 s * 2**3)
JITTER_MIN_DISTINCT = 15
_BASE = f"{lab.BACKOFF_BASE:g} s"  # as the formulas in messages write it: "1 s * 2**3"

_MAX_LINE_CHARS = 200  # far longer than any right line; longer lines are reported by length
_COUNT_CAP = 10_000  # count non-blank lines up to this many past the parsed ones, then stop
_QUOTE = 120  # a quoted line is at most this long
_KEYED_FORM = "`attempt=<n> wait=<seconds>`"


@dataclass(frozen=True)
class Parsed:
    """What a parser made of a file: ``ok`` with the waits in order, or not ``ok`` with a problem."""

    ok: bool
    values: tuple[float, ...] = ()
    problem: str = ""  # "" if ok; else one sentence for the learner, at most MAX_PROBLEM chars
    line: int | None = None  # the 1-based line the problem is on, when it is about one line


class _Reject(Exception):
    """Internal: carries the learner-facing problem out of the nested checks: the message ``key``
    of this exercise's catalog in the current language, and the line it is about (``lineno``)."""

    def __init__(self, key: str, /, **params):
        self.problem = tr(key, **params)
        self.line = params.get("lineno")
        super().__init__(self.problem)


def _parser(name: str):
    """Decorator: ``_Reject`` becomes a failed Parsed; any other exception too (unless testing)."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs) -> Parsed:
            try:
                return fn(*args, **kwargs)
            except _Reject as rejected:
                # A problem about one line names it ("line <n> of <file>"): that is where it points.
                return Parsed(False, (), bounded(rejected.problem), rejected.line)
            except Exception as exc:  # noqa: BLE001 - a grader must not show a traceback
                if stored_values._RAISE_INTERNAL_ERRORS:
                    raise
                return Parsed(False, (), bounded(tr("files.internal_error", name=name,
                                                   error=type(exc).__name__)))

        return wrapper

    return deco


# --------------------------------------------------------------------------------------------
# reading text and lines

_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_NONBLANK = re.compile(r"\S[^\n]*")  # from a line's first non-space character to its end


def _file_text(name: str, data, wanted: str) -> str:
    """The file's text with line endings normalised to LF, or _Reject."""
    if data is None:
        raise _Reject("files.missing", name=name, wanted=wanted)
    if isinstance(data, str):
        text = data
    elif isinstance(data, (bytes, bytearray, memoryview)):
        raw = data.tobytes() if isinstance(data, memoryview) else bytes(data)
        if not raw:
            raise _Reject("files.empty", name=name, wanted=wanted)
        if raw.startswith(_UTF16_BOMS):
            raise _Reject("files.utf16", name=name, wanted=wanted)
        nul = raw.find(b"\x00")
        if nul >= 0:
            raise _Reject("files.nul_byte", name=name, offset=nul, wanted=wanted)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Reject("files.not_utf8", name=name, byte=raw[exc.start], offset=exc.start,
                          wanted=wanted) from None
    else:
        raise _Reject("files.unreadable", name=name, type=type(data).__name__, wanted=wanted)
    if not text:
        raise _Reject("files.empty", name=name, wanted=wanted)
    if "\x00" in text:
        raise _Reject("files.nul_char", name=name, wanted=wanted)
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _nonblank_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, stripped text) of each line that is not blank, lazily."""
    lineno, pos = 1, 0
    for match in _NONBLANK.finditer(text):
        start = match.start()
        lineno += text.count("\n", pos, start)
        pos = start
        yield lineno, match.group().rstrip()


def _take(lines: Iterator[tuple[int, str]], wanted_count: int) -> tuple[list[tuple[int, str]], str]:
    """The first ``wanted_count + 1`` lines, and how many non-blank lines there are, as text."""
    head = list(itertools.islice(lines, wanted_count + 1))
    rest = sum(1 for _ in itertools.islice(lines, _COUNT_CAP))
    total = len(head) + rest
    if next(lines, None) is not None:
        return head, tr("files.more_than", count=total)
    return head, str(total)


def _quote(line: str) -> str:
    return f"'{shorten(line, _QUOTE)}'"


def _check_length(name: str, lineno: int, line: str, form: str) -> None:
    if len(line) > _MAX_LINE_CHARS:
        raise _Reject("files.too_long", lineno=lineno, name=name, length=len(line),
                      text=shorten(line, 60), form=form)


# --------------------------------------------------------------------------------------------
# numbers and line forms

_NONFINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
_WITH_UNIT = re.compile(r"[+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?\s*(?:s|sec|secs|second|seconds|ms)",
                        re.IGNORECASE)
_DECIMAL_COMMA = re.compile(r"[+-]?[0-9]+,[0-9]+")
_SEVERAL = re.compile(r"[^\s,;]+(?:[\s,;]+[^\s,;]+)+")
_NUMBERS_RUN = re.compile(r"(?:[+-]?[0-9][0-9.eE+-]*[\s,;]+){2,}[+-]?[0-9]")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_KEYED = re.compile(r"attempt\s*=\s*(?P<n>[^\s=,;]+)\s+wait\s*=\s*(?P<w>[^\s=;]+)")
_KEYED_ANY_CASE = re.compile(_KEYED.pattern, re.IGNORECASE)
_PLURAL_KEY = re.compile(r"attempts\s*=")
_COLON_KEY = re.compile(r"\b(?:attempt|wait)\s*:", re.IGNORECASE)


def _number(token: str) -> tuple[float | None, str]:
    """(value, "") for a finite number, else (None, a predicate saying why not: "is not a number")."""
    if NUMBER.fullmatch(token):
        value = float(token)
        if math.isfinite(value):
            return value, ""
        return None, tr("files.why.not_finite")
    if _NONFINITE.fullmatch(token):
        return None, tr("files.why.not_finite")
    if _WITH_UNIT.fullmatch(token):
        return None, tr("files.why.has_unit")
    if _DECIMAL_COMMA.fullmatch(token):
        return None, tr("files.why.decimal_comma")
    return None, tr("files.why.not_number")


def _keyed_hint(line: str) -> str:
    """Why a line is not `attempt=<n> wait=<s>`, as a clause starting with '; ', or ''."""
    if _KEYED_ANY_CASE.fullmatch(line):
        return tr("files.keyed.lower_case")
    if line[:1] in "{[":
        return tr("files.keyed.json")
    if _PLURAL_KEY.match(line):
        return tr("files.keyed.plural_key")
    if _COLON_KEY.search(line):
        return tr("files.keyed.colon")
    if "," in line or ";" in line:
        return tr("files.keyed.commas")
    has_attempt, has_wait = "attempt" in line, "wait" in line
    if not has_attempt and not has_wait:
        return tr("files.keyed.no_keys")
    if not has_attempt:
        return tr("files.keyed.no_attempt")
    if not has_wait:
        return tr("files.keyed.no_wait")
    return ""


def _parse_keyed(name: str, lineno: int, line: str) -> tuple[int, str, float]:
    """(attempt number, wait as written, wait) of an `attempt=<n> wait=<s>` line, or _Reject."""
    _check_length(name, lineno, line, tr("files.short_keyed_line", form=_KEYED_FORM))
    match = _KEYED.fullmatch(line)
    if match is None:
        raise _Reject("files.not_keyed", lineno=lineno, name=name, quote=_quote(line),
                      form=_KEYED_FORM, hint=_keyed_hint(line))
    attempt_text, wait_text = match["n"], match["w"]
    if not _INTEGER.fullmatch(attempt_text):
        raise _Reject("files.attempt_not_whole", lineno=lineno, name=name, quote=_quote(line),
                      form=_KEYED_FORM, attempt=shorten(attempt_text, 24))
    wait, why = _number(wait_text)
    if wait is None:
        raise _Reject("files.wait_not_number", lineno=lineno, name=name, quote=_quote(line),
                      form=_KEYED_FORM, wait=shorten(wait_text, 24), why=why)
    return int(attempt_text), wait_text, wait


def _parse_bare(name: str, lineno: int, line: str) -> tuple[str, float]:
    """(number as written, value) of a line holding one number, or _Reject."""
    if len(line) > _MAX_LINE_CHARS and _NUMBERS_RUN.match(line, 0, _MAX_LINE_CHARS):
        raise _Reject("files.several_numbers", lineno=lineno, name=name, text=shorten(line, 60))
    _check_length(name, lineno, line, tr("files.one_short_number"))
    value, why = _number(line)
    if value is None:
        if _KEYED.fullmatch(line) or "=" in line or ":" in line:
            why = tr("files.why.has_key")
        elif (not _DECIMAL_COMMA.fullmatch(line) and _SEVERAL.fullmatch(line)
              and all(NUMBER.fullmatch(t) for t in re.split(r"[\s,;]+", line))):
            why = tr("files.why.several")
        raise _Reject("files.not_bare", lineno=lineno, name=name, quote=_quote(line), why=why)
    return line, value


# --------------------------------------------------------------------------------------------
# shared checks of keyed rows and values


def _count_problem(name: str, wanted: str, found: str) -> _Reject:
    count = int(found) if found.isdigit() else None  # None ("more than N"): the plural form
    return _Reject("files.count", name=name, wanted=wanted, found=found, count=count)


def _check_numbering(name: str, rows: list[tuple[int, int]]) -> None:
    """rows: (line number, attempt number); attempts must be 0..len-1 in order."""
    attempts = [attempt for _, attempt in rows]
    last = len(rows) - 1
    if attempts == list(range(1, len(rows) + 1)):
        raise _Reject("files.from_one", name=name, count=len(rows), last=last)
    for expected, (lineno, attempt) in enumerate(rows):
        if attempt != expected:
            raise _Reject("files.out_of_order", lineno=lineno, name=name,
                          attempt=shorten(str(attempt), 24), expected=expected, last=last)


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _check_values(name: str, rows: list[tuple[int, str, float]], expected: tuple[int, ...],
                  formula, cap: float | None = None) -> None:
    """rows: (line number, wait as written, wait); the first wrong wait is reported."""
    values = [value for _, _, value in rows]
    if all(_same(v, e * 1000) for v, e in zip(values, expected)):
        raise _Reject("files.milliseconds", name=name, first=rows[0][1], second=rows[1][1],
                      expected=" ".join(map(str, expected)))
    for attempt, ((lineno, text, value), want) in enumerate(zip(rows, expected)):
        if not _same(value, want):
            why = ""
            if value < 0:
                why = tr("files.why_negative")
            elif cap is not None and value > cap:
                why = tr("files.why_no_cap", cap=cap)
            raise _Reject("files.wrong_wait", lineno=lineno, name=name, attempt=attempt,
                          wait=shorten(text, 24), want=want, formula=formula(attempt), why=why)


# --------------------------------------------------------------------------------------------
# the parsers

def _schedule_wanted() -> str:
    return tr("files.schedule.wanted", form=_KEYED_FORM)


@_parser("schedule.txt")
def parse_schedule(data: bytes | None) -> Parsed:
    """schedule.txt: 6 lines `attempt=<n> wait=<s>`, n = 0..5 in order, waits 1 2 4 8 16 32."""
    name = "schedule.txt"
    text = _file_text(name, data, _schedule_wanted())
    head, found = _take(_nonblank_lines(text), len(SCHEDULE_WAITS))
    if found == "0":
        raise _Reject("files.only_blank", name=name, wanted=_schedule_wanted())
    rows = [(lineno, *_parse_keyed(name, lineno, line)) for lineno, line in head]
    if found != str(len(SCHEDULE_WAITS)):
        raise _count_problem(name, _schedule_wanted(), found)
    _check_numbering(name, [(lineno, attempt) for lineno, attempt, _, _ in rows])
    waits = [(lineno, text_, value) for lineno, _, text_, value in rows]
    values = [value for _, _, value in waits]
    if all(_same(v, 2 ** (n + 1)) for n, v in enumerate(values)):
        raise _Reject("files.schedule.doubled", name=name)
    _check_values(name, waits, SCHEDULE_WAITS, lambda n: f"{_BASE} * 2**{n}")
    return Parsed(True, tuple(values), "")


def _jitter_wanted() -> str:
    return tr("files.jitter.wanted", count=JITTER_COUNT, max=JITTER_MAX)


_JITTER_DRAW = f"random.uniform(0, min(cap, {_BASE} * 2**3)) = random.uniform(0, {JITTER_MAX})"


@_parser("jitter.txt")
def parse_jitter(data: bytes | None) -> Parsed:
    """jitter.txt: exactly 20 finite numbers in [0, 8], one per line, at least 15 distinct."""
    name = "jitter.txt"
    text = _file_text(name, data, _jitter_wanted())
    head, found = _take(_nonblank_lines(text), JITTER_COUNT)
    if found == "0":
        raise _Reject("files.only_blank", name=name, wanted=_jitter_wanted())
    values: list[float] = []
    for lineno, line in head:
        written, value = _parse_bare(name, lineno, line)
        if value < 0:
            raise _Reject("files.jitter.negative", lineno=lineno, name=name, quote=_quote(written),
                          max=JITTER_MAX, draw=_JITTER_DRAW)
        if value > JITTER_MAX:
            raise _Reject("files.jitter.above", lineno=lineno, name=name, quote=_quote(written),
                          max=JITTER_MAX, draw=_JITTER_DRAW)
        values.append(value)
    if found != str(JITTER_COUNT):
        raise _count_problem(name, _jitter_wanted(), found)
    distinct = len(set(values))
    if distinct == 1:
        raise _Reject("files.jitter.constant", count=JITTER_COUNT, name=name, quote=_quote(head[0][1]),
                      draw=_JITTER_DRAW, distinct=JITTER_MIN_DISTINCT)
    if distinct < JITTER_MIN_DISTINCT:
        if all(v.is_integer() for v in values):
            raise _Reject("files.jitter.integers", name=name, distinct=distinct, count=JITTER_COUNT,
                          draw=_JITTER_DRAW, minimum=JITTER_MIN_DISTINCT)
        raise _Reject("files.jitter.few_distinct", name=name, distinct=distinct, count=JITTER_COUNT,
                      minimum=JITTER_MIN_DISTINCT, draw=_JITTER_DRAW)
    return Parsed(True, tuple(values), "")


def _capped_wanted() -> str:
    return tr("files.capped.wanted", form=_KEYED_FORM, cap=CAP)


def _looks_keyed(line: str) -> bool:
    return "=" in line or "attempt" in line.lower() or "wait" in line.lower()


@_parser("capped.txt")
def parse_capped(data: bytes | None) -> Parsed:
    """capped.txt: attempts 0..8 as 9 bare numbers or 9 `attempt=<n> wait=<s>` lines,
    with the waits 1 2 4 8 16 30 30 30 30."""
    name = "capped.txt"
    text = _file_text(name, data, _capped_wanted())
    head, found = _take(_nonblank_lines(text), len(CAPPED_WAITS))
    if found == "0":
        raise _Reject("files.only_blank", name=name, wanted=_capped_wanted())
    first_lineno, first_line = head[0]
    keyed = _looks_keyed(first_line)
    numbered: list[tuple[int, int]] = []
    waits: list[tuple[int, str, float]] = []
    for lineno, line in head:
        mixed = NUMBER.fullmatch(line) if keyed else _KEYED.fullmatch(line)
        if mixed:
            bare = tr("files.capped.bare_number")
            one, other = (_KEYED_FORM, bare) if keyed else (bare, _KEYED_FORM)
            raise _Reject("files.capped.mixed", lineno=lineno, name=name, quote=_quote(line),
                          other=other, first=first_lineno, one=one)
        if keyed:
            attempt, written, value = _parse_keyed(name, lineno, line)
            numbered.append((lineno, attempt))
        else:
            written, value = _parse_bare(name, lineno, line)
        waits.append((lineno, written, value))
    if found != str(len(CAPPED_WAITS)):
        raise _count_problem(name, _capped_wanted(), found)
    if keyed:
        _check_numbering(name, numbered)
    values = [value for _, _, value in waits]
    if all(_same(v, CAP) for v in values):
        raise _Reject("files.capped.thirty_everywhere", name=name, cap=CAP,
                      expected=" ".join(map(str, CAPPED_WAITS)))
    _check_values(name, waits, CAPPED_WAITS, lambda n: f"min({CAP}, {_BASE} * 2**{n})", cap=CAP)
    return Parsed(True, tuple(values), "")


# --------------------------------------------------------------------------------------------
# requeue.out

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
# Each pattern starts with the literal "attempts" so that the search scans at C speed; the character
# before it is checked by _token_matches (a look-behind would defeat the literal-prefix scan).
_ANY_ATTEMPTS = re.compile(rb"attempts\\?[\"']?[ \t]*[=:][ \t]*([^\s,;:)\]}'\"\\]{1,20})")
_WORD_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def _attempts_token(n: int) -> re.Pattern[bytes]:
    return re.compile(rb"attempts\\?[\"']?[ \t]*[=:][ \t]*" + re.escape(str(n).encode())
                      + rb"(?![0-9A-Za-z_]|\.[0-9])")


def _token_matches(pattern: re.Pattern[bytes], raw: bytes) -> Iterator[re.Match[bytes]]:
    """Matches of ``pattern`` that start a word (not ``max_attempts=2``), in order; gives up
    after ``_COUNT_CAP * 10`` candidates so that adversarial output stays cheap."""
    pos = 0
    for _ in range(_COUNT_CAP * 10):
        match = pattern.search(raw, pos)
        if match is None:
            return
        start = match.start()
        if start == 0 or raw[start - 1] not in _WORD_BYTES:
            yield match
        pos = start + 1


@_parser("requeue.out")
def requeue_out_shows_attempts(data: bytes | None, n: int = 2) -> Parsed:
    """requeue.out shows the attempt count ``n`` as a token: ``attempts=2``, ``attempts: 2``,
    ``"attempts": 2`` or ``'attempts': 2`` (not ``attempts=20``, ``attempts=2.5``,
    ``max_attempts=2``). The file is worker output, so it is searched as bytes: other noise,
    invalid UTF-8 and ANSI colour codes around the number do not matter; UTF-16 with a
    byte-order mark is decoded first. ``values`` is always empty."""
    name = "requeue.out"
    try:
        n = int(n)
    except Exception:  # noqa: BLE001
        n = 2
    wanted = tr("files.requeue.wanted", n=n)
    if data is None:
        raise _Reject("files.requeue.missing", name=name, wanted=wanted)
    if isinstance(data, str):
        raw = data.encode("utf-8", "replace")
    elif isinstance(data, (bytes, bytearray, memoryview)):
        raw = data.tobytes() if isinstance(data, memoryview) else bytes(data)
    else:
        raise _Reject("files.requeue.unreadable", name=name, type=type(data).__name__)
    if not raw.strip():
        raise _Reject("files.requeue.empty", name=name, wanted=wanted)
    if raw.startswith(_UTF16_BOMS):  # PowerShell's `>`; searched as decoded text and as bytes
        raw = raw.decode("utf-16", "replace").encode("utf-8", "replace") + b"\n" + raw
    if b"\x1b" in raw:
        raw = _ANSI.sub(b"", raw)
    if next(_token_matches(_attempts_token(n), raw), None) is not None:
        return Parsed(True, (), "")
    seen: list[str] = []
    for match in itertools.islice(_token_matches(_ANY_ATTEMPTS, raw), 10_000):
        shown = shorten(match.group(1).decode("utf-8", "replace"), 20)
        if shown not in seen:
            seen.append(shown)
            if len(seen) == 5:
                break
    if seen:
        return Parsed(False, (), bounded(tr("files.requeue.other_counts", name=name, n=n,
                                           seen=", ".join(seen))))
    return Parsed(False, (), bounded(tr("files.requeue.not_shown", name=name, n=n, wanted=wanted)))


# --------------------------------------------------------------------------------------------
# values for plots


def waits_by_line(data, limit: int = 40) -> list[tuple[int, float | None]]:
    """(line number, wait or None) of the first ``limit`` non-blank lines, read leniently (a bare
    number, or the ``wait=`` of an ``attempt=<n> wait=<s>`` line), to plot what a learner wrote next
    to a parser's problem. Never raises; [] for a missing or unreadable file."""
    try:
        if isinstance(data, memoryview):
            data = data.tobytes()
        if isinstance(data, (bytes, bytearray)):
            text = bytes(data[: 1 << 20]).decode("utf-8", "replace")
        elif isinstance(data, str):
            text = data[: 1 << 20]
        else:
            return []
        text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
        found = []
        for lineno, line in itertools.islice(_nonblank_lines(text), max(0, limit)):
            keyed = _KEYED_ANY_CASE.fullmatch(line[:_MAX_LINE_CHARS])
            token = keyed["w"] if keyed else line[:_MAX_LINE_CHARS]
            value, _ = _number(token)
            found.append((lineno, value))
        return found
    except Exception:  # noqa: BLE001 - a plot is a bonus; never let it break a message
        if stored_values._RAISE_INTERNAL_ERRORS:
            raise
        return []
