"""One virtual clock for both consumers, and each script's own view of it.

consumer.py and retry_consumer.py run side by side on ONE RunClock: a nextRetryTime written by the main
consumer must come due on the retry consumer's clock, and a sleep in either moves time for both (a learner
process takes the run's new offset at its next reply of the application channel: a notify or a sleep).

Each run is given a `ClockView` of that clock instead of the clock itself. The view delegates everything and
notes the advances its own run made, with the real time of each: step 2 asks how long consumer.py itself
waited between a failure and the notifications behind it, which the shared clock cannot say (the retry
consumer jumps it by an interval meanwhile, as it should); step 3 allows for jumps the OTHER run made
between a failure and the retry record's Produce.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from retrylab.appchannel import RunClock


@dataclass(frozen=True)
class Advance:
    at: float           # real time (time.time()) the run asked for it
    seconds: float      # virtual seconds it moved the shared clock


class ClockView(RunClock):
    """A run's view of the `shared` clock: its offset and time are the shared clock's; `advances` are the
    ones this run made (a RunClock, so the runner, the link and the application channel take it as one)."""

    def __init__(self, shared: RunClock, name: str):
        super().__init__(shared.start, virtual=shared.virtual)
        self.shared = shared
        self.name = name
        self._advances: list[Advance] = []
        self._own_lock = threading.Lock()

    @property
    def offset(self) -> float:
        return self.shared.offset

    def advance(self, seconds: float) -> float:
        # noted as asked, not as the offset moved: the other run may advance the clock at the same moment
        if seconds > 0 and self.virtual:
            with self._own_lock:
                self._advances.append(Advance(time.time(), float(seconds)))
        return self.shared.advance(seconds)

    def now(self) -> float:
        return self.shared.now()

    @property
    def advances(self) -> tuple[Advance, ...]:
        with self._own_lock:
            return tuple(self._advances)

    def advanced_between(self, start: float, end: float) -> float:
        """Virtual seconds this run's own advances moved the clock between two real times."""
        return sum(a.seconds for a in self.advances if start <= a.at <= end)


def pair_clocks(main: str, retry: str) -> tuple[RunClock, ClockView, ClockView]:
    """A learner run's clock (days ahead of real time) and the two scripts' views of it."""
    shared = RunClock.for_learner_run()
    return shared, ClockView(shared, main), ClockView(shared, retry)
