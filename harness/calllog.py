"""The harness's record of calls of an exercise's instrumented module (e.g. its process(msg)).

Kept in the grading process's memory by the application channel (appchannel.py): each call is
recorded as the harness received and decided it, never as the learner's process describes it.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

MALFORMED = "malformed"     # the outcome of a request the harness could not read as a call
CALLS, BYTES = "calls", "bytes"     # the kinds of a record's limit (RecordLimit.kind)


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
    # Seconds the calling process (`peer`) had waited, ready, for a CPU up to this call, with the harness thread
    # that stamped it and the machine's steal time (appchannel._cpu_waited); None when the kernel cannot tell.
    # Between two calls of one peer, its growth bounds how much a busy machine may have stretched the gap.
    cpu_wait: float | None = None
    peer: int | None = None          # the pid that made the call as the kernel says (SO_PEERCRED), None: unknown


@dataclass(frozen=True)
class RecordLimit:
    """The limit of a CallRecord that a run went over: `value` calls (kind CALLS), or `value` bytes of
    records (kind BYTES: calls whose ids, arguments and errors were each bounded, but many and large)."""
    kind: str
    value: int


def footprint(call: Call) -> int:
    """Bytes of the grader's memory one record takes: the object and every text in it (a text's size
    depends on its widest character, so it is measured, not counted in characters)."""
    texts = (call.id, call.arg, call.error, call.error_class, call.fn, call.altered)
    return (sys.getsizeof(call) + sys.getsizeof(call.__dict__)
            + sum(sys.getsizeof(text) for text in texts if isinstance(text, str)))


class CallRecord:
    """The calls of one run, in the order they reached the harness: at most `limit` of them, taking at
    most `budget` bytes together. A call past either is refused (not kept) and the run is over."""

    def __init__(self, limit: int, budget: int):
        self.limit = limit
        self.budget = budget
        self._calls: list[Call] = []
        self._bytes = 0
        self._exceeded: RecordLimit | None = None
        self._lock = threading.Lock()

    @property
    def over_limit(self) -> bool:
        """A call was refused: the run made more than `limit` calls, or more than `budget` bytes of them."""
        return self._exceeded is not None

    @property
    def exceeded(self) -> RecordLimit | None:
        """Which limit the run went over first (None: neither)."""
        return self._exceeded

    @property
    def full(self) -> bool:
        return len(self._calls) >= self.limit or self._exceeded is not None

    @property
    def bytes(self) -> int:
        return self._bytes

    def add(self, call: Call) -> bool:
        """Record `call`; False (and refused, not kept) when it does not fit the record's limits."""
        size = footprint(call)
        with self._lock:
            if len(self._calls) >= self.limit:
                self._refuse(RecordLimit(CALLS, self.limit))
                return False
            if self._bytes + size > self.budget:
                self._refuse(RecordLimit(BYTES, self.budget))
                return False
            self._calls.append(call)
            self._bytes += size
            return True

    def refuse(self) -> None:
        """A call made once the record is full: not kept."""
        with self._lock:
            self._refuse(RecordLimit(CALLS, self.limit))

    def _refuse(self, limit: RecordLimit) -> None:
        if self._exceeded is None:
            self._exceeded = limit

    def malformed(self, problem: str, head: bytes, clock) -> None:
        self.add(Call(t=clock.now(), id=None, is_dict=False, arg=head.decode("latin-1"), outcome=MALFORMED,
                      error=problem, offset=clock.offset))

    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def __len__(self) -> int:
        return len(self._calls)
