"""Compact plain-text plots for check messages: a learner's values against the range they must lie in.

Plain ASCII, fixed width, one row per value, so a plot reads the same in a terminal, in a JSON
``message`` and in a JUnit report. Nothing here is language-specific: row labels, notes and captions
are the caller's (already translated) text. A row::

     7  |################################|> 9.5   above 8
        ^ scale start                  ^ scale end, '>' the value goes past it

- ``#`` the bar up to the value, inside the allowed band; ``!`` the bar where it leaves the band;
- ``.`` the allowed band not reached; blank: outside the band;
- ``=`` (marker plots, e.g. gaps) the allowed band, ``o`` the value in it, ``X`` the value outside it;
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


def _cells(value: float | None, band: tuple[float, float], scale: tuple[float, float], width: int,
           style: str) -> tuple[str, str, str]:
    """(before, cells, after) of one bar."""
    low, high = scale
    step = (high - low) / width
    band_low, band_high = band
    centres = [low + (i + 0.5) * step for i in range(width)]
    inside = [band_low <= c <= band_high for c in centres]
    if value is None or not math.isfinite(value):
        return " ", "".join("?" if i == 0 else ("." if ins else " ") for i, ins in enumerate(inside)), " "
    if style == "marker":  # the band drawn, the value one mark on it
        cells = ["=" if ins else " " for ins in inside]
        if low <= value <= high:
            at = min(width - 1, int((value - low) / step))
            cells[at] = "o" if band_low <= value <= band_high else "X"
        return ("<" if value < low else " "), "".join(cells), (">" if value > high else " ")
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
         width: int = WIDTH, style: str = "bar", more: str = "+{count}") -> str:
    """One bar per row on a common scale, under an axis of ``ticks`` (default: the scale's ends and
    the first row's band). ``style`` "bar" fills up to the value; "marker" draws the band and marks
    the value on it (``o`` inside, ``X`` outside). Rows past MAX_ROWS are summarised by ``more``."""
    if not rows:
        return ""
    shown = list(rows[:MAX_ROWS])
    label_width = max(len(r.label) for r in shown)
    value_width = max(len(_number(r.value)) for r in shown)
    ticks = ticks or (scale[0], *shown[0].band, scale[1])
    lines = [" " * (label_width + 1) + _axis(scale, ticks, width)]
    for row in shown:
        before, cells, after = _cells(row.value, row.band, scale, width, style)
        text = f"{row.label:>{label_width}}{before}|{cells}|{after} {_number(row.value):>{value_width}}"
        if row.note:
            text += f"  {row.note}"
        lines.append(text.rstrip())
    if len(rows) > MAX_ROWS:
        lines.append(" " * (label_width + 2) + more.format(count=len(rows) - MAX_ROWS))
    return "\n".join(lines)


def _scale_end(values: Sequence[float | None], at_least: float) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return max([at_least, *finite])


def value_bars(values: Sequence[float | None], *, band: tuple[float, float], scale: tuple[float, float],
               labels: Sequence[str] | None = None, notes: Sequence[str] | None = None,
               width: int = WIDTH) -> str:
    """The values (e.g. the waits a learner wrote, one per line) as bars on ``scale`` with the
    allowed ``band`` marked. ``labels`` default to 1, 2, 3, ...; ``notes`` go after the values."""
    labels = list(labels) if labels is not None else [str(i) for i in range(1, len(values) + 1)]
    notes = list(notes) if notes is not None else [""] * len(values)
    rows = [Row(label, value, band, note) for label, value, note in zip(labels, values, notes)]
    return bars(rows, scale=scale, ticks=(scale[0], *band, scale[1]), width=width)


def retry_timeline(times: Sequence[float], allowed: Sequence[tuple[float, float]], *,
                   gaps: Sequence[float] | None = None, notes: Sequence[str] | None = None,
                   width: int = WIDTH) -> str:
    """Attempts of one message on a clock, then each gap between attempts against its allowed range.

    ``times``: when each attempt started (seconds, any origin); ``allowed``: for gap k (between
    attempts k+1 and k+2) its (low, high). The first line places the attempts (1, 2, ...) on one
    time axis; then one row per gap, labelled "1-2", "2-3", ..., with the allowed range drawn as
    ``=`` and the observed gap marked ``o`` (inside) or ``X`` (outside). ``gaps``: the values to
    judge instead of the differences of ``times`` (e.g. the waits net of processing time).

    In a check (the caption from the exercise's catalog, rows kept left to right in Persian)::

        chart = plots.retry_timeline(times, [(0, w.bound) for w in waits], gaps=[w.seconds for w in waits])
        fail(problem + "\n" + tr("plot.timeline_caption") + "\n" + i18n.ltr_lines(chart))
    """
    if not times:
        return ""
    start = times[0]
    offsets = [t - start for t in times]
    gaps = list(gaps) if gaps is not None else [b - a for a, b in zip(times, times[1:])]
    span = _scale_end(offsets, 1.0)
    strip = [" "] * width
    for index, offset in enumerate(offsets, start=1):
        at = min(width - 1, round(offset / span * (width - 1)))
        mark = str(index) if index < 10 else "+"
        strip[at] = mark if strip[at] in (" ", "-") else "*"
    last = max((i for i, c in enumerate(strip) if c != " "), default=0)
    strip = [("-" if c == " " and i < last else c) for i, c in enumerate(strip)]
    label_width = max(3, len(f"{len(times) - 1}-{len(times)}"))
    head = f"{'t':>{label_width}} |{''.join(strip)}|  0..{_number(span)} s"
    if not gaps:
        return head
    high = _scale_end(gaps, max(hi for _, hi in allowed[:len(gaps)]) if allowed else 1.0)
    notes = list(notes) if notes is not None else [""] * len(gaps)
    rows = [Row(f"{k + 1}-{k + 2}", gap, allowed[k] if k < len(allowed) else (0.0, 0.0),
                notes[k] if k < len(notes) else "")
            for k, gap in enumerate(gaps)]
    ticks = sorted({0.0, high, *(hi for _, hi in allowed[:len(gaps)])})
    return head + "\n" + bars(rows, scale=(0.0, high), ticks=ticks, width=width, style="marker")
