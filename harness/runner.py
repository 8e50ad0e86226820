"""Running one learner script against a private broker server, and watching it while it runs.

`LearnerRunner.run` ties the pieces together: the sandbox (a contained subprocess in a copy of the
submission), the broker's link to its private server (`endpoint.link(...)`, a
retrylab.brokers.LearnerLink: the recording relay in front of it, every command the script sends),
and the application channel (every call of the exercise's instrumented module, decided and recorded
by the harness, and the run's virtual clock). A stop condition sees a live `Progress` and decides
when a worker that never exits has done all it is going to do.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from typing import Any

from retrylab import i18n
from retrylab.appchannel import AppChannel, Application, RunClock, describe_call_limit
from retrylab.calllog import Call, RecordLimit
from retrylab.limits import RUN_MARGIN, StepClock
from retrylab.sandbox import Limits, Sandbox, ScriptResult
from retrylab.settle import Reason, Stop, StopCondition, never
from retrylab.verdict import CheckFailed


def load_application(application: str) -> Application:
    """The application of "module:factory" (an exercise's `application`), made fresh."""
    module, _, factory = application.partition(":")
    return getattr(importlib.import_module(module), factory)()


@dataclass(frozen=True)
class RunTiming:
    """Where one learner run's real time went, in seconds (for benchmarks; recording it is free)."""
    script: str
    prepare: float              # copying the submission, starting the recording proxy
    first_command: float | None  # process start to its first broker command (interpreter, imports, connect)
    run: float                  # the process's whole life, start to exit or stop
    settle: float               # of `run`: from the last change it saw to the stop condition's yes
    cleanup: float              # stopping the process group, closing the proxy, removing the copy
    cpu: float | None = None    # CPU seconds the learner's processes had (user + system)
    reason: str = "exited"      # why it ended (a retrylab.settle.Reason value)
    attempts: int = 1           # 2: re-run once, the first run stopped before its first broker command
    cut: bool = False           # stopped by the step's time limit
    thread: str = ""            # the harness thread that ran it: MainThread (a step), else one beside the steps


@dataclass(frozen=True)
class ScriptRun:
    """What one run of a learner script did."""
    result: ScriptResult | None     # None: the script does not exist in the submission
    calls: tuple[Call, ...]
    commands: tuple                 # what the script sent its broker, in order (the broker's record type)
    timing: RunTiming | None = None
    # the run was stopped for making more calls (or bytes of them) than this: describe_call_limit says so
    call_limit: RecordLimit | None = None
    received: tuple = ()            # what the broker sent the script, where its link records it (LearnerLink.received)
    starved: bool = False           # stopped by a wall-clock limit before it could start (see _starved)

    @property
    def missing(self) -> bool:
        return self.result is None


class RunNotStarted(RuntimeError):
    """A learner run was stopped by a wall-clock limit before it could start (no broker command,
    hardly any CPU), and a second run could not start either, or the step's own limit stopped it:
    the machine gave it no chance to work, which says nothing about the learner's code."""


class Progress:
    """A live view of a running script, for stop conditions (retrylab.settle).

    `look()` is called once before each time the conditions are asked; it notes when the broker's
    state (the link's `shape()`) or the call log last changed, and the learner's CPU time then, so
    that "no progress" is counted in CPU time the learner had, from its first broker command on."""

    def __init__(self, link, channel: AppChannel, sandbox: Sandbox | None = None):
        self.link = link
        self.channel = channel
        self.sandbox = sandbox
        self._signature = None
        self._changed_at = time.monotonic()
        self._cpu = 0.0
        self._cpu_at_change: float | None = None    # None until the first broker command
        self._commands_at_change = 0
        self.changes = 0                            # how many changes the looks saw (the first command's included)
        self._calm: tuple | None = None             # what the link and /proc showed at the last look
        self._blocked: list = []
        self.stopped_at: float | None = None        # when the stop condition said "stop"

    def calls(self) -> list[Call]:
        return self.channel.calls()

    def snapshot(self) -> Any:
        """The broker's whole state, bounded (what the link gives: checks read it)."""
        return self.link.snapshot()

    def commands(self) -> list:
        return self.link.commands()

    # -- what the runner updates once per look ---------------------------------------------------
    def look(self) -> None:
        self._cpu = self.sandbox.learner_cpu() if self.sandbox else 0.0
        if not self.started():
            return
        signature = (self.link.shape(), len(self.channel.record))
        if signature != self._signature or self._cpu_at_change is None:
            self._signature, self._changed_at, self._cpu_at_change = signature, time.monotonic(), self._cpu
            self._commands_at_change = len(self.link.commands())
            self.changes += 1
        self._blocked = self._look_blocked()

    def _look_blocked(self) -> list:
        """The blocking reads the learner waits in, if that is all it does: the same ones as at the
        last look, nothing else crossed the relay, no CPU in between, no thread ready to run."""
        waiting = self.link.waiting()
        if waiting is None:
            self._calm = None
            return []
        previous, self._calm = self._calm, (waiting.state, self._cpu)
        if previous is None or previous[0] != waiting.state or self._cpu - previous[1] > _CPU_NOISE:
            return []
        if self.running():
            return []
        if self.link.could_wake(waiting.reads):
            return []   # something to take, or taken and its reply on its way: the learner is not stuck
        return waiting.reads

    # -- what stop conditions read ---------------------------------------------------------------
    def started(self) -> bool:
        """Whether the learner has sent its first broker command."""
        return self.link.started()

    def cpu(self) -> float:
        """CPU seconds the learner's processes have had, as of the last look."""
        return self._cpu

    def running(self) -> bool:
        """Whether a thread of the learner's processes is running or ready to run now: on a busy machine one can
        wait seconds for a CPU (a process about to exit, say), and must not be taken for one that waits."""
        return self.sandbox is not None and self.sandbox.learner_running()

    def cpu_since_change(self) -> float:
        """CPU seconds the learner had since its first broker command or the last change, whichever
        is later (0.0 before its first command)."""
        return 0.0 if self._cpu_at_change is None else self._cpu - self._cpu_at_change

    def commands_since_change(self) -> list:
        return self.link.commands()[self._commands_at_change:]

    def blocked_reads(self) -> list:
        """The blocking reads the learner waits in with nothing else going on ([] if it does more);
        each has `read_timeout` (seconds, 0.0: forever) and `same_read(other)` (see retrylab.settle)."""
        return self._blocked

    def settle_wait(self) -> float:
        """Real time from the last change the conditions saw to their "stop"."""
        if self.stopped_at is None or self._signature is None:  # exited by itself, or stopped before a change
            return 0.0
        return max(0.0, self.stopped_at - self._changed_at)


_CPU_NOISE = 0.015   # /proc counts CPU in ticks (10 ms): a tick's rounding is not activity


class LearnerRunner:
    """Runs a submission's scripts. `application`: the exercise's application module, "module:factory"
    (Exercise.application), made fresh for each run whose check passes none; None: runs have none."""

    def __init__(self, submission: Path, limits: Limits = Limits(), clock: StepClock | None = None,
                 application: str | None = None, learner_imports: tuple[str, ...] = (),
                 warm_imports: tuple[str, ...] = ()):
        self.submission = Path(submission)
        self.limits = limits
        self.clock = clock      # the current step's time limit, when run under the plugin
        self.application = application
        self.learner_imports = learner_imports   # the broker's client libraries (Broker.learner_imports)
        self.warm_imports = warm_imports         # of those, what the warm template imports ahead
        # every run's timing, those beside the steps (no step clock) too; copies share it (without_step_clock)
        self.timings: list[RunTiming] = []

    def run(self, script: str, endpoint, *, timeout: float,
            stop_when: StopCondition | None = None, app: Application | None = None,
            run_clock: RunClock | None = None, args: tuple[str, ...] = ()) -> ScriptRun:
        """Run `script` (with command-line `args`) until it exits, `stop_when` (retrylab.settle) says to stop it, it makes more
        calls of the application than the channel allows, or `timeout` seconds pass: an outer bound
        for a run that does not finish, fewer if the current step's time limit comes first (the run is
        then cut short and the clock is told, so the step fails for its time limit). A run that a
        wall-clock limit stopped before it could start (`_starved`) is run once more; if that happens
        again, or the step's limit stopped it, `RunNotStarted` (a harness-side error, not a verdict).
        `endpoint` is the private server a broker's backend gave (`backend.private()`): its
        `link(sandbox, run_clock)` is the run's way to it. `app` decides the application module's calls
        (by default a fresh one of the runner's `application`, knowing no seeded message); `run_clock`
        is the run's virtual clock (by default a new one, days ahead of real
        time: take it from the caller when it compares a learner's timestamps with the run's time; RunClock.real()
        for a run on real time)."""
        path = self.submission / script
        if not path.is_file():
            if os.path.lexists(path):  # there (a folder, a FIFO, a broken link), but nothing to run: not "missing"
                raise CheckFailed(i18n.label("run.not_a_file", script=script))
            return ScriptRun(result=None, calls=(), commands=())
        stop_when = stop_when if stop_when is not None else never()   # still measured: CPU, why it ended
        if app is None and self.application:
            app = load_application(self.application)
        run_clock = run_clock or RunClock.for_learner_run()
        first = self._run_once(script, endpoint, timeout, stop_when, app, run_clock, args)
        if not first.starved:
            return first
        again = None if first.timing.cut else self._run_once(script, endpoint, timeout, stop_when, app, run_clock,
                                                               args, attempt=2)
        if again is None or again.starved:
            raise RunNotStarted(i18n.label("run.not_started", script=script, cpu=first.result.cpu or 0.0,
                                           broker=first.result.broker))
        return again

    def _run_once(self, script: str, endpoint, timeout: float, stop_when: StopCondition,
                  app: Application | None, run_clock: RunClock, args: tuple[str, ...] = (),
                  attempt: int = 1) -> ScriptRun:
        left = self.clock.remaining() if self.clock else None
        by_step_limit = left is not None and left - RUN_MARGIN < timeout
        if by_step_limit:
            timeout = max(0.0, left - RUN_MARGIN)
        began = time.monotonic()
        # The step's alarm waits for the whole run, setup and cleanup included: one raised while the
        # copy of the submission is being removed would leave the rest of it behind. The run itself
        # is bounded by what is left of the step (`timeout` above), so the step still ends in time.
        with self.clock.shielded() if self.clock else contextlib.nullcontext(), _heap_frozen(), \
                Sandbox(self.submission, self.limits, learner_imports=self.learner_imports,
                        warm_imports=self.warm_imports) as sandbox, \
                endpoint.link(sandbox, run_clock) as link, \
                AppChannel(sandbox.socket_path("app.sock"), app, run_clock) as channel:
            progress = Progress(link, channel, sandbox)
            env = {**link.env, "RETRYLAB_APP_SOCKET": str(channel.path),
                   "RETRYLAB_CLOCK_OFFSET": repr(run_clock.offset),   # where the learner's clocks start
                   "RETRYLAB_CLOCK_VIRTUAL": "1" if run_clock.virtual else "0"}
            if app is not None:
                env.update(RETRYLAB_APP_MODULE=app.module, RETRYLAB_APP_STUB=str(app.stub))
            stops: list[Stop] = []
            cpu = [0.0]
            runnable: list[bool] = []     # near the wall-clock limit: was a learner thread ready to run?
            watch_from = time.monotonic() + max(0.0, timeout - STARVED_WINDOW)

            def settled() -> bool:  # stop_when, noting why and when it said yes
                if time.monotonic() >= watch_from:
                    runnable.append(sandbox.learner_running())
                if channel.over_limit:   # a flood of calls: stopped whatever the learner is doing
                    stops.append(Stop(Reason.CAP, describe_call_limit(script, channel.exceeded)))
                    return True
                progress.look()
                cpu[0] = progress.cpu()
                stop = stop_when.check(progress)
                if stop is None:
                    return False
                stops.append(stop)
                progress.stopped_at = time.monotonic()
                return True
            prepared, wall_start = time.monotonic(), time.time()
            result = sandbox.run(script, args=args, env=env, timeout=timeout, stop_when=settled,
                                 poll=POLL if run_clock.virtual else REAL_TIME_POLL)
            commands = tuple(link.commands())
            received = tuple(link.received())
            reason = (Reason.EXITED if not result.stopped else stops[-1].reason if stops else Reason.WALL)
            result = dataclasses.replace(result, reason=reason.value, cpu=cpu[0], broker=link.broker_name,
                                         detail=stops[-1].detail if stops and result.stopped else "")
            done = ScriptRun(result=result, calls=tuple(channel.calls()), commands=commands,
                             call_limit=channel.exceeded, received=received)
            finished = time.monotonic()
        first = done.commands[0].at - wall_start if done.commands else None
        timing = RunTiming(script=script, prepare=prepared - began, first_command=first, run=result.seconds,
                           settle=progress.settle_wait(), cleanup=time.monotonic() - finished,
                           cpu=cpu[0], reason=reason.value, attempts=attempt,
                           cut=by_step_limit and result.stopped == "timeout",
                           thread=threading.current_thread().name)
        self.timings.append(timing)
        if self.clock and timing.cut:
            self.clock.cut(i18n.label("run.cut", script=script))
        return dataclasses.replace(done, timing=timing, starved=_starved(done, runnable))


_frozen_by_runs = [0]           # runs going on that froze the heap (runs beside a step overlap it)
_frozen_lock = threading.Lock()


@contextlib.contextmanager
def _heap_frozen():
    """While learner runs go on, the collector leaves the objects the grading process had before them alone.

    The relay and the application channel are threads of this process (the brokers' servers are processes of their
    own): a full collection holds them while it walks the heap, and the learner's commands and calls wait. Its
    length grows with the heap: tens of milliseconds in a CLI grading, a hundred and more in a test worker that has
    graded many submissions. Step 2 of a lab compares retry waits with a margin of 100 ms, so such a pause in one
    wait and not the other fails a correct consumer. Frozen (gc.freeze), the old heap is skipped; what the runs
    allocate is still collected. It is unfrozen when the last run ends, unless the process had frozen objects of
    its own before (a host that manages its collector that way keeps its choice)."""
    with _frozen_lock:
        # counted: this run froze the heap or joins runs that did; not where the process froze objects itself
        counted = _frozen_by_runs[0] > 0 or gc.get_freeze_count() == 0
        if counted:
            if _frozen_by_runs[0] == 0:
                gc.freeze()
            _frozen_by_runs[0] += 1
    try:
        yield
    finally:
        if counted:
            with _frozen_lock:
                _frozen_by_runs[0] -= 1
                if _frozen_by_runs[0] == 0:
                    gc.unfreeze()


# Seconds between two looks at a running script (its broker's state, its calls, its stop condition). On
# real time a run's waits are hundreds of milliseconds and several runs go on at once, each look costing
# its broker a few requests: looking less often there leaves an embedded server free to serve the learner.
POLL = 0.02
REAL_TIME_POLL = 0.05


# CPU seconds: a run stopped by a wall-clock limit with less than this, and no broker command, never
# got going (an interpreter with its imports needs about 0.2 s): the machine starved it.
STARVED_CPU = 0.5
# Seconds before the wall-clock limit in which the runner notes whether a learner thread is ready to run.
STARVED_WINDOW = 0.5


def _starved(run: ScriptRun, runnable: list[bool]) -> bool:
    """Stopped by a wall-clock limit (its own, or the step's), not by what it did, before its first
    broker command, with too little CPU to have started and without a line of output: a verdict on it
    would be one on the machine. Not so for a script that printed (it got going: one on real time may
    then sleep), nor one whose processes were all asleep as the limit came (waiting on a signal, say:
    that is what it chose to do; a starved one is ready to run and gets no CPU)."""
    result = run.result
    asleep = bool(runnable) and not any(runnable)
    return (result.stopped == "timeout" and not run.commands and (result.cpu or 0.0) < STARVED_CPU
            and not (result.stdout or result.stderr).strip() and not asleep)
