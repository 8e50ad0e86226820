"""Reading lag.py's stdout: one `t,lag` line per sample, an optional header line first.

`t` may be epoch seconds, epoch milliseconds, ISO 8601 (a time without an offset is UTC: the sandbox runs
with TZ=UTC), or seconds since the script started; the kind is told by the first sample's format and
magnitude, and every sample must use the same kind. `lag` is a count (a whole number; `12.0` is read as 12).

Nothing here knows the run: `parse` only says what was printed. Lines that are neither a sample, the
header, blank, nor the sandbox's own marker of output it did not keep are garbage: counted, the first kept
to show. Reading is bounded (MAX_LINES): a flood of lines is counted, not parsed.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone

MAX_LINES = 5000                # lines read; stdout is capped by the sandbox (64 KiB) anyway
MAX_SHOWN = 120                 # characters of a line a message shows

EPOCH_S = "epoch_s"
EPOCH_MS = "epoch_ms"
ISO = "iso"
SINCE_START = "since_start"
ABSOLUTE = (EPOCH_S, EPOCH_MS, ISO)     # the clocks that say when by themselves

# magnitudes: epoch seconds are about 1.8e9 now, epoch milliseconds 1.8e12; seconds since start are small
_EPOCH_S_RANGE = (1e8, 1e11)
_EPOCH_MS_RANGE = (1e11, 1e14)
# the sandbox's marker where it dropped the middle of a long output ("[... 123 bytes not shown ...]")
_ELIDED = re.compile(r"^\[\.\.\. .* \.\.\.\]$")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


@dataclass(frozen=True)
class Sample:
    line: int           # 1-based line number in lag.py's stdout
    t: float            # seconds: since the epoch (absolute clocks) or since start (SINCE_START), as printed
    lag: int
    text: str           # the line as printed (shortened)


@dataclass(frozen=True)
class BadLine:
    line: int
    text: str
    why: str            # a reason key (step5.why.<key>): what is wrong with it


@dataclass(frozen=True)
class Series:
    samples: tuple[Sample, ...]
    clock: str | None           # the first sample's clock kind; None without samples
    header: str | None
    garbage: int                # lines that are none of the above (clock mix-ups included)
    first_bad: BadLine | None
    unread: int                 # lines past MAX_LINES, not parsed
    elided: bool                # the sandbox kept only the start and the end of the output


def shown(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 1] + "…"


def _number(text: str) -> float | None:
    text = text.strip()
    if not _NUMBER.match(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def read_time(text: str) -> tuple[str, float] | None:
    """(clock kind, seconds) of a printed time, or None when it is none of the accepted forms."""
    value = _number(text)
    if value is not None:
        if _EPOCH_MS_RANGE[0] <= value < _EPOCH_MS_RANGE[1]:
            return EPOCH_MS, value / 1000.0
        if _EPOCH_S_RANGE[0] <= value < _EPOCH_S_RANGE[1]:
            return EPOCH_S, value
        if abs(value) < _EPOCH_S_RANGE[0]:
            return SINCE_START, value
        return None
    text = text.strip()
    if not re.match(r"^\d{4}-\d{2}-\d{2}", text):   # ISO 8601 starts with the date
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return ISO, moment.timestamp()


def read_lag(text: str) -> int | None:
    value = _number(text)
    if value is None or value < 0 or value != int(value):
        return None
    return int(value)


def _is_header(text: str) -> bool:
    """A comment line (`# t,lag`), or two names, neither a time nor a number: `t,lag`, `time,lag`,
    `timestamp, lag`, `timestamp [s],lag [entries]` ..."""
    fields = text.split(",")
    return text.startswith("#") or len(fields) == 2 and all(
        f.strip() and _number(f) is None and read_time(f) is None
        and re.match(r"^[^\W\d][\w ()\[\]/.%-]*$", f.strip()) for f in fields)


def parse(stdout: str) -> Series:
    lines = stdout.splitlines()
    unread = max(0, len(lines) - MAX_LINES)
    samples: list[Sample] = []
    header = None
    garbage = 0
    first_bad = None
    clock = None
    elided = False
    seen_content = False

    def bad(number: int, text: str, why: str) -> None:
        nonlocal garbage, first_bad
        if number in cut:
            return
        garbage += 1
        if first_bad is None:
            first_bad = BadLine(number, shown(text), why)

    # Lines cut, not printed wrong (not garbage if they are bad): a last line without its newline (the
    # harness stopped the script mid-write), and the two halves of lines around the sandbox's marker.
    cut = {len(lines)} if lines and not stdout.endswith(("\n", "\r")) and not unread else set()
    for number, raw in enumerate(lines[:MAX_LINES], start=1):
        if _ELIDED.match(raw.strip()):
            cut |= {number - 1, number + 1}
    for number, raw in enumerate(lines[:MAX_LINES], start=1):
        text = raw.strip()
        if not text:
            continue
        if _ELIDED.match(text):
            elided = True
            continue
        first_content, seen_content = not seen_content, True
        if first_content:
            text = text.removeprefix("\ufeff").strip()     # a byte order mark some writers put first
            if _is_header(text):
                header = shown(text)
                continue
        fields = text.split(",")
        if len(fields) != 2:
            bad(number, text, "fields")
            continue
        when = read_time(fields[0])
        lag = read_lag(fields[1])
        if when is None:
            bad(number, text, "time")
            continue
        if lag is None:
            bad(number, text, "lag")
            continue
        kind, seconds = when
        if clock is None:
            clock = kind
        elif kind != clock and not (kind in ABSOLUTE and clock in ABSOLUTE):
            bad(number, text, "clock_mix")      # seconds since start on one line, a date on another
            continue
        samples.append(Sample(number, seconds, lag, shown(text)))
    return Series(samples=tuple(samples), clock=clock, header=header, garbage=garbage, first_bad=first_bad,
                  unread=unread, elided=elided)
