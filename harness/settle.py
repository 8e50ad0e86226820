"""When a learner run has done all it is going to do: composable stop conditions.

A worker may never exit, so the harness must decide when to stop it. That decision is judged from
what the learner is doing, never from wall-clock quiet alone: on a busy machine a learner's process
may get no CPU for seconds, and a run stopped then would be judged on work it never had the chance
to do. What counts:

- it exited (the sandbox sees that; no condition is needed);
- `blocked()`: it waits in a blocking read (the broker's link says which of its commands are those,
  e.g. a pop that waits for a list) with nothing to take, no reply is on its way through the relay,
  it sends nothing else, and its processes use no CPU and have no thread ready to run between two
  looks; `blocked(forever=True)`: such a read has no timeout, so nothing but another client could ever wake it;
- `no_progress(cpu=S)`: neither the broker's state nor the call log changed while its processes had S
  seconds of CPU, counted from its first broker command (an interpreter starting on a starved CPU
  is not a learner going round in circles); before that command, only `startup` seconds of CPU
  with no broker command at all count (a script spinning without any I/O);
- `repeated_read(n)`: the same blocking read with a timeout, n times over with no progress (a
  one-shot script waiting in a loop);
- an exercise's own condition, `when(predicate, reason)`: e.g. its work is done, or a message was
  processed so often that the worker retries forever.

Conditions combine like tenacity's `stop_*`: `blocked() & when(done, ...)` stops a worker blocked
with its work done; `a | b` stops when either says so. A condition answers with a `Stop` (why) or
None; the first that answers in an `|` is the reason given, and in an `&` its last member's (put the
most specific last, e.g. the exercise's own `when`; cheap conditions first: an `&` stops asking at
the first that does not answer).
Wall-clock limits stay in the runner as generous outer bounds (Reason.WALL), never as a condition.

Conditions are stateless: what they need across looks (CPU at the last change, what the relay
showed last time) lives in `Progress`, one per run, which the runner updates once per look.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

__all__ = ["Reason", "Stop", "StopCondition", "blocked", "never", "no_progress", "repeated_read", "when"]


class Reason(str, enum.Enum):
    """Why a run ended; each has a message (harness/locales, [run.stop])."""
    EXITED = "exited"                  # it ended by itself
    BLOCKED_DONE = "blocked_done"      # waiting in a blocking read with its work done
    DONE_IDLE = "done_idle"            # its work done, no change while it had some CPU (it polls)
    DONE_WAITED = "done_waited"        # its work done and still done after some real seconds (a run on real time)
    BLOCKED_FOREVER = "blocked_forever"  # waiting in a blocking read that has no timeout
    WAITING_LOOP = "waiting_loop"      # the same blocking read over and over, nothing changing
    NO_PROGRESS = "no_progress"        # no change while its processes were running on CPU
    SPIN_NO_IO = "spin_no_io"          # CPU time without a single broker command
    CAP = "cap"                        # an exercise's cap (e.g. one message processed without end)
    CANCELLED = "cancelled"            # the grading ended first (interrupted, a step's limit)
    WALL = "wall"                      # the outer wall-clock limit: the harness stopped a run that did not finish


@dataclass(frozen=True)
class Stop:
    reason: Reason
    detail: str = ""    # the condition's own words, in the current language (e.g. an exercise's cap)


class StopCondition:
    """Answers, for a live run (runner.Progress), whether to stop it now and why."""

    def check(self, progress) -> Stop | None:
        raise NotImplementedError

    def __call__(self, progress) -> bool:
        return self.check(progress) is not None

    def __or__(self, other: StopCondition) -> StopCondition:
        return _Any(self, other)

    def __and__(self, other: StopCondition) -> StopCondition:
        return _All(self, other)


class _Any(StopCondition):
    def __init__(self, *parts: StopCondition):
        self.parts = tuple(p for part in parts for p in (part.parts if isinstance(part, _Any) else (part,)))

    def check(self, progress) -> Stop | None:
        for part in self.parts:
            stop = part.check(progress)
            if stop is not None:
                return stop
        return None

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.parts))


class _All(StopCondition):
    def __init__(self, *parts: StopCondition):
        self.parts = tuple(p for part in parts for p in (part.parts if isinstance(part, _All) else (part,)))

    def check(self, progress) -> Stop | None:
        stops = []
        for part in self.parts:
            stop = part.check(progress)
            if stop is None:
                return None
            stops.append(stop)
        return Stop(stops[-1].reason, next((s.detail for s in stops if s.detail), ""))

    def __repr__(self) -> str:
        return "(" + " & ".join(map(repr, self.parts)) + ")"


class when(StopCondition):
    """An exercise's own condition: `predicate(progress)` true means stop, for `reason`; `detail`
    (optional) says it in the exercise's words, e.g. how often one message was processed."""

    def __init__(self, predicate: Callable[[object], bool], reason: Reason,
                 detail: Callable[[object], str] | None = None):
        self.predicate, self.reason, self.detail = predicate, Reason(reason), detail

    def check(self, progress) -> Stop | None:
        if not self.predicate(progress):
            return None
        return Stop(self.reason, self.detail(progress) if self.detail else "")

    def __repr__(self) -> str:
        return f"when({getattr(self.predicate, '__name__', 'predicate')}, {self.reason.value})"


class never(StopCondition):
    """Never stops a run: it ends when it exits, or at the outer wall limit."""

    def check(self, progress) -> Stop | None:
        return None


class blocked(StopCondition):
    """The learner waits in a blocking read with nothing else going on: every command still waiting
    for a reply is a blocking read, no command or reply crossed the relay since the last look, and
    its processes had no CPU in between. `forever`: only when one of those reads has no timeout."""

    def __init__(self, *, forever: bool = False):
        self.forever = forever

    def check(self, progress) -> Stop | None:
        reads = progress.blocked_reads()
        if not reads:
            return None
        if self.forever:
            if any(c.read_timeout == 0.0 for c in reads):
                return Stop(Reason.BLOCKED_FOREVER, _shown(reads))
            return None
        return Stop(Reason.BLOCKED_DONE, _shown(reads))

    def __repr__(self) -> str:
        return "blocked(forever=True)" if self.forever else "blocked()"


class no_progress(StopCondition):
    """Nothing changed (the broker's state, the call log) while the learner's processes had `cpu` seconds of CPU
    since its first broker command, or since the last change; or it had `startup` seconds of CPU
    without sending a single broker command."""

    def __init__(self, cpu: float, *, startup: float = 1.5):
        self.cpu, self.startup = cpu, startup

    def check(self, progress) -> Stop | None:
        if not progress.started():
            used = progress.cpu()
            return Stop(Reason.SPIN_NO_IO, f"{used:.1f}") if used >= self.startup else None
        used = progress.cpu_since_change()
        return Stop(Reason.NO_PROGRESS, f"{used:.1f}") if used >= self.cpu else None

    def __repr__(self) -> str:
        return f"no_progress(cpu={self.cpu}, startup={self.startup})"


class repeated_read(StopCondition):
    """The learner sent the same blocking read (command and keys) `times` times since the last
    change, and waits in it again: it waits in a loop for something that does not come. Right for
    one-shot scripts; a worker may legitimately wait like that for a retry to come due."""

    def __init__(self, times: int = 3):
        self.times = times

    def check(self, progress) -> Stop | None:
        reads = progress.blocked_reads()
        if not reads:
            return None
        current = reads[-1]
        same = [c for c in progress.commands_since_change() if current.same_read(c)]
        if len(same) >= self.times:
            return Stop(Reason.WAITING_LOOP, _shown(reads))
        return None

    def __repr__(self) -> str:
        return f"repeated_read({self.times})"


def _shown(reads: list, limit: int = 60) -> str:
    text = " ".join(a.decode("utf-8", "replace") for a in reads[-1].args)
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"
