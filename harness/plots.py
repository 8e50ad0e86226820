"""Compact plain-text plots for check messages: a learner's values against the range they must lie in.

Plain ASCII, fixed width, one row per value, so a plot reads the same in a terminal, in a JSON
``message`` and in a JUnit report. Nothing here is language-specific: row labels, notes and captions
are the caller's (already translated) text. A row::

     7  |################################|> 9.5   above 8
        ^ scale start                  ^ scale end, '>' the value goes past it

- ``#`` the bar up to the value, inside the allowed band; ``!`` the bar where it leaves the band;
- ``.`` the allowed band not reached; blank: outside the band;
- ``>`` / ``<`` the value is beyond the end / before the start of the scale; ``?`` not a number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

WIDTH = 32          # cells of a bar
MAX_ROWS = 40       # rows shown; the rest are counted in a last line


@dataclass(frozen=True)
class Row:
    label: str
    value: float | None                 # None: the line held no number
    band: tuple[float, float]           # the allowed range for this value
    note: str = ""                      # e.g. "expected 30"; the caller's language


def _number(value: float) -> str:
    if value is None or not math.isfinite(value):
        return "?"
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _cells(value: float | None, band: tuple[float, float], scale: tuple[float, float],
           width: int) -> tuple[str, str, str]:
    """(before, cells, after) of one bar."""
    low, high = scale
    step = (high - low) / width
    band_low, band_high = band
    centres = [low + (i + 0.5) * step for i in range(width)]
    inside = [band_low <= c <= band_high for c in centres]
    if value is None or not math.isfinite(value):
        return " ", "".join("?" if i == 0 else ("." if ins else " ") for i, ins in enumerate(inside)), " "
    filled = round((min(max(value, low), high) - low) / step)
    cells = []
    for i, ins in enumerate(inside):
        if i < filled:
            cells.append("#" if ins else "!")
        else:
            cells.append("." if ins else " ")
    return ("<" if value < low else " "), "".join(cells), (">" if value > high else " ")


def _axis(scale: tuple[float, float], ticks: Sequence[float], width: int) -> str:
    """A line of tick labels above the bars: each tick's number starts at its cell."""
    low, high = scale
    line = [" "] * (width + 8)
    for tick in sorted(set(ticks)):
        if not low <= tick <= high:
            continue
        text = _number(tick)
        at = 1 + round((tick - low) / (high - low) * width)
        if tick == high:
            at = min(at, width + 1)
        start = max(0, min(at, len(line) - len(text)))
        if any(c != " " for c in line[max(0, start - 1):start + len(text) + 1]):
            continue  # would touch a tick already placed
        line[start:start + len(text)] = text
    return "".join(line).rstrip()


def bars(rows: Sequence[Row], *, scale: tuple[float, float], ticks: Sequence[float] = (),
         width: int = WIDTH, more: str = "+{count}") -> str:
    """One bar per row on a common scale, under an axis of ``ticks`` (default: the scale's ends and
    the first row's band), each filled up to its value. Rows past MAX_ROWS are summarised by ``more``."""
    if not rows:
        return ""
    shown = list(rows[:MAX_ROWS])
    label_width = max(len(r.label) for r in shown)
    value_width = max(len(_number(r.value)) for r in shown)
    ticks = ticks or (scale[0], *shown[0].band, scale[1])
    lines = [" " * (label_width + 1) + _axis(scale, ticks, width)]
    for row in shown:
        before, cells, after = _cells(row.value, row.band, scale, width)
        text = f"{row.label:>{label_width}}{before}|{cells}|{after} {_number(row.value):>{value_width}}"
        if row.note:
            text += f"  {row.note}"
        lines.append(text.rstrip())
    if len(rows) > MAX_ROWS:
        lines.append(" " * (label_width + 2) + more.format(count=len(rows) - MAX_ROWS))
    return "\n".join(lines)


def value_bars(values: Sequence[float | None], *, band: tuple[float, float], scale: tuple[float, float],
               labels: Sequence[str] | None = None, notes: Sequence[str] | None = None,
               width: int = WIDTH) -> str:
    """The values (e.g. the waits a learner wrote, one per line) as bars on ``scale`` with the
    allowed ``band`` marked. ``labels`` default to 1, 2, 3, ...; ``notes`` go after the values."""
    labels = list(labels) if labels is not None else [str(i) for i in range(1, len(values) + 1)]
    notes = list(notes) if notes is not None else [""] * len(values)
    rows = [Row(label, value, band, note) for label, value, note in zip(labels, values, notes)]
    return bars(rows, scale=scale, ticks=(scale[0], *band, scale[1]), width=width)
