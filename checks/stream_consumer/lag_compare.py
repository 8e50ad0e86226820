"""Comparing lag.py's series (lag_series.parse) with the harness's own samples of the group's lag.

Times: an absolute clock (epoch s or ms, ISO 8601) says when by itself. Seconds since start are placed by
the first sample: lag.py cannot print a lag before it has asked Redis, so its first line is taken to be
printed at its first broker command (its clock's zero is wherever it started it: after the imports, at
the top of the file, before a first sleep ...). Such a clock must still look like one that started with
the script: its first value at most FIRST_SINCE_START_SLACK past the first command's time since the
process started (time.monotonic() or perf_counter() is seconds since boot: not "since start").

Agreement (LAB.md): a line agrees when some harness sample within lab.LAG_WINDOW of its time is within
`tolerance` of its value; the harness samples every ~50 ms, so a window always holds several.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from retrylab.checks.stream_consumer import lab
from retrylab.checks.stream_consumer.lag_series import ABSOLUTE, Sample, Series

MIN_TOLERANCE = 5               # entries: the tolerance is max(MIN_TOLERANCE, TOLERANCE_SHARE of the peak)
TOLERANCE_SHARE = 0.10
GAP_RANGE = (0.35, 0.75)        # seconds: the median gap between two lines, for "about every 0.5 s"
MIN_LINES = 4                   # the run holds a quiet start, a burst, its drain and a quiet end
DATED_SLACK = 0.5               # seconds a line may be dated outside lag.py's run (clocks, scheduling)
FIRST_SINCE_START_SLACK = 1.0   # seconds: see the module's docstring


@dataclass(frozen=True)
class HarnessSample:
    at: float           # time.time() of the sample (the middle of its two reads)
    lag: int            # undelivered + pending
    pending: int
    xlen: int


@dataclass(frozen=True)
class RunWindow:
    """When lag.py ran, in epoch seconds: from its process start to its stop, and its first broker command."""
    started: float
    ended: float
    first_command: float | None


@dataclass(frozen=True)
class Dated:
    sample: Sample
    at: float           # epoch seconds the line stands for


@dataclass(frozen=True)
class Compared:
    dated: Dated
    agrees: bool
    low: int | None     # the harness's lowest and highest lag in the line's window (None: no sample there)
    high: int | None


def tolerance(harness: list[HarnessSample]) -> float:
    peak = max((h.lag for h in harness), default=0)
    return max(MIN_TOLERANCE, TOLERANCE_SHARE * peak)


def date(series: Series, run: RunWindow) -> list[Dated]:
    samples = series.samples
    if not samples:
        return []
    if series.clock in ABSOLUTE:
        return [Dated(s, s.t) for s in samples]
    anchor = run.first_command if run.first_command is not None else run.started
    return [Dated(s, anchor + (s.t - samples[0].t)) for s in samples]


def clock_problem(series: Series, dated: list[Dated], run: RunWindow) -> tuple[str, Sample | None]:
    """("", None) when the times are plausible; else a reason key (step5.clock.<key>) and the line."""
    samples = series.samples
    if series.clock not in ABSOLUTE and samples:
        started_after = (run.first_command if run.first_command is not None else run.started) - run.started
        if not -DATED_SLACK <= samples[0].t <= started_after + FIRST_SINCE_START_SLACK:
            return "not_since_start", samples[0]
    for before, after in zip(samples, samples[1:]):
        if after.t <= before.t:
            return ("same_time" if after.t == before.t else "backwards"), after
    for d in dated:
        if d.at < run.started - DATED_SLACK:
            return "before_run", d.sample
        if d.at > run.ended + DATED_SLACK:
            return "after_run", d.sample
    return "", None


def median_gap(dated: list[Dated]) -> float | None:
    gaps = [b.at - a.at for a, b in zip(dated, dated[1:])]
    return statistics.median(gaps) if gaps else None


def compare(dated: list[Dated], harness: list[HarnessSample], tol: float,
            measure: Callable[[HarnessSample], int] = lambda h: h.lag) -> list[Compared]:
    """Each line against the harness's `measure` (the lag; XLEN to recognise that mistake)."""
    found = []
    for d in dated:
        window = [measure(h) for h in harness if abs(h.at - d.at) <= lab.LAG_WINDOW]
        agrees = any(abs(lag - d.sample.lag) <= tol for lag in window)
        found.append(Compared(d, agrees, min(window, default=None), max(window, default=None)))
    return found


def agreement(compared: list[Compared]) -> float:
    return sum(c.agrees for c in compared) / len(compared) if compared else 0.0


def floor_at_lines(compared: list[Compared]) -> int:
    """The most the group's lag surely was at one of the lines: over the lines, the highest of the lowest
    harness sample in each line's window. A series that follows the lag reaches it (within the tolerance)
    at its highest line; one that leaves part of the lag out (e.g. only the pending entries) stays below."""
    return max((c.low for c in compared if c.low is not None), default=0)


def peak_index(dated: list[Dated]) -> int:
    """The first line with the highest value."""
    return max(range(len(dated)), key=lambda i: (dated[i].sample.lag, -i))


def drained_after_peak(dated: list[Dated]) -> Dated | None:
    """The first line printing 0 after the peak, if any."""
    peak = peak_index(dated)
    return next((d for d in dated[peak + 1:] if d.sample.lag == 0), None)


def counts_stream_length(dated: list[Dated], harness: list[HarnessSample], tol: float,
                         drained_at: float | None) -> bool:
    """XLEN mistaken for lag: once the group had drained, the lines still print about the stream's length
    (every entry ever added: the burst never "drains" from XLEN), and the whole series follows XLEN as
    closely as a right one follows the lag (so a series that is merely wrong is not called XLEN)."""
    if drained_at is None:
        return False
    after = [d for d in dated if d.at > drained_at + lab.LAG_WINDOW]
    if not after:
        return False
    length = max((h.xlen for h in harness), default=0)
    return (length > tol and all(abs(d.sample.lag - length) <= tol for d in after)
            and agreement(compare(dated, harness, tol, measure=lambda h: h.xlen)) >= lab.LAG_AGREEMENT)
