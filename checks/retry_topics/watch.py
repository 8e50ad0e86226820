"""Watching the two consumers of a run from the harness's side, and ending them together.

Each learner run of a pair gets `watch.stop_condition(script)` as its stop condition: the runner calls it
every look (20 ms), and it keeps the run's live `Progress` (its relay, its sandbox), samples the run's CPU
and threads with the time and the shared clock's, and stops the run when the harness says so (`end()`) or
the grading is cancelled. The harness's own thread drives the scenario from these: `kill()` ends both runs'
processes at once with SIGKILL (Sandbox.kill: a crash, which no SIGTERM handler of the learner softens).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from retrylab.settle import Reason, Stop, StopCondition

FETCH = 1           # Kafka's Fetch request: a consumer that sends one has its partitions (its group is stable)


@dataclass(frozen=True)
class Sample:
    at: float           # real epoch seconds
    virtual: float      # the shared clock then
    cpu: float          # CPU seconds the run's processes had so far
    threads: int        # threads of its processes then


class _Stop(StopCondition):
    def __init__(self, watch: RunWatch, script: str):
        self.watch, self.script = watch, script

    def check(self, progress) -> Stop | None:
        return self.watch.look(self.script, progress)


class RunWatch:
    def __init__(self, clock, cancelled: threading.Event):
        self.clock = clock
        self.cancelled = cancelled
        self._lock = threading.Lock()
        self._progress: dict[str, object] = {}
        self._samples: dict[str, list[Sample]] = {}
        self._ending = False

    def stop_condition(self, script: str) -> StopCondition:
        return _Stop(self, script)

    def look(self, script: str, progress) -> Stop | None:
        sample = Sample(time.time(), self.clock.now(), progress.cpu(), progress.sandbox.learner_threads())
        with self._lock:
            self._progress[script] = progress
            self._samples.setdefault(script, []).append(sample)
            ending = self._ending
        if self.cancelled.is_set():
            return Stop(Reason.CANCELLED)
        return Stop(Reason.DONE_WAITED) if ending else None

    # -- what the harness's thread reads -------------------------------------------------------------
    def progress(self, script: str):
        with self._lock:
            return self._progress.get(script)

    def samples(self, script: str) -> list[Sample]:
        with self._lock:
            return list(self._samples.get(script, ()))

    def fetching(self, script: str) -> bool:
        """Whether the script's consumer has been given partitions and reads them."""
        progress = self.progress(script)
        return progress is not None and any(r.api_key == FETCH for r in progress.commands())

    def committed(self, script: str) -> dict[tuple[str, str, int], int]:
        """The offsets the script committed, as its requests said: (group, topic, partition) -> offset."""
        progress = self.progress(script)
        return progress.link.relay.committed() if progress is not None else {}

    def produced_requests(self, script: str) -> list:
        progress = self.progress(script)
        return [r for r in progress.commands() if r.produced] if progress is not None else []

    # -- what the harness's thread does ----------------------------------------------------------------
    def kill(self) -> None:
        """SIGKILL every process of every run watched, at once."""
        with self._lock:
            progresses = list(self._progress.values())
        for progress in progresses:
            progress.sandbox.kill()

    def end(self) -> None:
        """Stop the runs at their next look (SIGTERM, as any run the harness stops)."""
        with self._lock:
            self._ending = True
