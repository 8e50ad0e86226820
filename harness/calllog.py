"""The harness's record of calls of an exercise's instrumented module (taskproc's process(msg)).

Kept in the grading process's memory by the application channel (appchannel.py): each call is
recorded as the harness received and decided it, never as the learner's process describes it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

MALFORMED = "malformed"     # the outcome of a request the harness could not read as a call


@dataclass(frozen=True)
class Call:
    t: float              # the run's virtual time when the call reached the harness
    id: str | None        # the message id process saw (top level, or in an envelope's payload)
    is_dict: bool
    arg: str              # the argument as JSON text (bounded)
    outcome: str          # "ok" | "error" | "malformed" (a request that was not a readable call)
    error: str | None     # the exception's text; for a malformed request, what was wrong with it
    error_class: str | None = None   # the exception's class name (TimeoutError, HTTPError, ...)
    # The run's virtual clock offset at the call: seconds the run's processes had slept or spent in
    # calls. t - offset is real time, so a gap between calls splits into sleeping and real work.
    offset: float | None = None
    pid: int | None = None           # the learner process that made the call (as it said)
    fn: str = "process"              # the module's function called
    altered: str | None = None       # a seeded message's field the argument changed ("kind"), None: unchanged


class CallRecord:
    """The calls of one run, in the order they reached the harness; at most `limit` of them."""

    def __init__(self, limit: int):
        self.limit = limit
        self._calls: list[Call] = []
        self._refused = 0
        self._lock = threading.Lock()

    @property
    def over_limit(self) -> bool:
        """A call was refused: the run made more than `limit` calls."""
        return self._refused > 0

    @property
    def full(self) -> bool:
        return len(self._calls) >= self.limit

    def add(self, call: Call) -> bool:
        """Record `call`; False (and refused, not kept) when the record is full already."""
        with self._lock:
            if len(self._calls) >= self.limit:
                self._refused += 1
                return False
            self._calls.append(call)
            return True

    def refuse(self) -> None:
        with self._lock:
            self._refused += 1

    def malformed(self, problem: str, head: bytes, clock) -> None:
        self.add(Call(t=clock.now(), id=None, is_dict=False, arg=head.decode("latin-1"), outcome=MALFORMED,
                      error=problem, offset=clock.offset))

    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def __len__(self) -> int:
        return len(self._calls)
