"""Does stream-consumer's step 2 hold when the learner's consumer is stalled mid-wait? Grades step 2 of
corpus entries, keeping consumer.py from running for S seconds right after the flaky order's Nth failed call,
and prints the verdict beside the one the corpus expects ("error": not graded, the step said the machine was
too busy to judge; not a wrong verdict, and counted apart).

    python bench/step2_stall.py                       # the entries and freezes that went wrong before
    python bench/step2_stall.py --freeze 0.6 --after 1 --match not-before-schedule

Why: on a 2-core machine with a slow CPU, bench/load_agreement.py --load --exercise stream-consumer gave
wrong step 2 verdicts both ways (a constant min-idle passed, consumers with a schedule of their own failed):
step 2 judges a growing wait on the gaps between calls when it cannot tell that the consumer claimed the
entry as soon as it was due, and a consumer that gets no CPU for a while makes both the gaps and that
inference wrong. Load makes it likely; a freeze at a chosen moment makes it certain, so this script
reproduces it on a quiet machine in under a minute.

Each grading runs in this process (pytest with the harness's plugin, step 2 only); the freeze is set off
from the call channel's thread when the call reaches the harness. By default (--how cpu, root) consumer.py is
starved of CPU as on a busy machine: moved to CPU 0 while a real-time busy loop holds it. --how stop freezes it
with SIGSTOP instead, which the kernel's schedstat does not count as waiting for a CPU, so step 2 cannot tell
it from a consumer that sleeps. Nothing here asserts; the exit status
is 1 if a verdict differs from the corpus's.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from retrylab import exercise as exercises
from retrylab.checks.stream_consumer import run_retry
from retrylab.fixtures.stream_consumer import corpus
from retrylab.grading import pytest_args
from retrylab.plugin import record_of
from retrylab.procfs import find_processes, threads
from retrylab.sandbox import RUN_ID_VARIABLE, RUN_TAG_VARIABLE
from retrylab.supervisor import kill

TAG = f"stall{os.getpid()}"
HOW = ["cpu"]       # how a stall is made: "cpu" (_starve) or "stop" (SIGSTOP, then SIGCONT)
DEFAULT_CASES = (("wrong/constant-min-idle", 2), ("correct/not-before-schedule", 1),
                 ("correct/own-schedule-blocking-read", 1), ("reference", 2))


class _Reference:
    """The reference solution, graded like a corpus entry."""
    id, expect = "reference", {2: "pass"}

    @staticmethod
    def materialize(dest: Path) -> Path:
        shutil.copytree(corpus.REFERENCE, dest, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
        return dest


def _freeze(seconds: float) -> None:
    """Keep this script's learner processes from running for `seconds`, as HOW says."""
    frozen = find_processes(f"{RUN_ID_VARIABLE}={TAG}-")
    if HOW[0] == "stop":
        kill(frozen, signal.SIGSTOP)
        threading.Timer(seconds, kill, (frozen, signal.SIGCONT)).start()
    else:
        _starve(frozen, seconds)


def _threads(pids: list[int]) -> list[int]:
    return [tid for pid in pids for tid in threads(pid)]


def _starve(pids: list[int], seconds: float) -> None:
    """A busy machine, at its worst: the processes' threads are moved to CPU 0 and a real-time busy loop holds
    that CPU for `seconds` (they are ready to run, and wait: what the kernel counts in schedstat's run_delay).
    Then they may run anywhere again. Needs root (SCHED_FIFO)."""
    threads, everywhere = _threads(pids), os.sched_getaffinity(0)
    for tid in threads:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, {0})
    hog = os.fork()
    if hog == 0:        # the child only spins and exits: nothing of the parent's state is used
        try:
            os.sched_setaffinity(0, {0})
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                pass
        finally:
            os._exit(0)

    def release():
        os.waitpid(hog, 0)
        for tid in _threads(pids):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, everywhere)
    threading.Thread(target=release, daemon=True).start()


def _freezing_app(after: int, seconds: float, runs: int):
    """run_retry's EffectsApp, with on_call wrapped: in the first `runs` runs of the grading (step 2 makes a run
    again when a busy machine may have decided it), the flaky order's `after`th failure freezes the consumer."""
    original, made = run_retry.EffectsApp, [0]

    def make(seeded, on_call):
        made[0] += 1
        if made[0] > runs:
            return original(seeded=seeded, on_call=on_call)
        flaky = next(o["order_id"] for o in seeded if o["kind"] == "flaky")
        failures = [0]

        def wrapped(order_id: str, failed: bool) -> None:
            if failed and order_id == flaky:
                failures[0] += 1
                if failures[0] == after:
                    _freeze(seconds)
            on_call(order_id, failed)
        return original(seeded=seeded, on_call=wrapped)
    return make


class _Verdict:
    def __init__(self):
        self.outcome, self.message = "not run", ""

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.failed:
            self.outcome = "pass" if report.passed else "fail"
            lines = [line for line in report.longreprtext.splitlines() if line.strip()]
            self.message = lines[-1][:160] if lines else ""

    def pytest_runtest_teardown(self, item):
        if record_of(item).unjudged is not None:     # not graded (CannotJudge): no verdict either way
            self.outcome = "error"


def grade(entry, after: int, seconds: float, runs: int) -> _Verdict:
    exercise = exercises.get("stream-consumer")
    verdict = _Verdict()
    with tempfile.TemporaryDirectory() as folder:
        submission = entry.materialize(Path(folder) / "submission")
        args = [*pytest_args(exercise), "--solution", str(submission), "--backend", "fake", "-q",
                "-k", "test_flaky_entry_reclaimed_after_growing_waits_then_applied_once"]
        saved = run_retry.EffectsApp
        run_retry.EffectsApp = _freezing_app(after, seconds, runs)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                pytest.main(args, plugins=[verdict])
        finally:
            run_retry.EffectsApp = saved
    return verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--freeze", type=float, default=0.6, metavar="S", help="seconds consumer.py is stopped")
    parser.add_argument("--after", type=int, help="freeze after the flaky order's Nth failure (1 or 2)")
    parser.add_argument("--match", action="append", default=[], help="only corpus entries whose id contains this")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--stalled-runs", type=int, default=1, metavar="K",
                        help="stall only the first K runs of consumer.py in a grading (default 1: a busy moment)")
    parser.add_argument("--how", choices=("cpu", "stop"), default="cpu",
                        help="cpu: a real-time busy loop holds the CPU consumer.py is moved to (root); "
                             "stop: SIGSTOP, which no schedstat counts")
    args = parser.parse_args()
    HOW[0] = args.how
    os.environ[RUN_TAG_VARIABLE] = TAG
    entries = {e.id: e for e in corpus.entries()} | {"reference": _Reference}
    cases = [(name, args.after or after) for name, after in DEFAULT_CASES
             if not args.match or any(m in name for m in args.match)]
    if args.match:
        cases += [(i, args.after or 1) for i in entries if any(m in i for m in args.match) and
                  i not in dict(cases)]
    wrong = unjudged = 0
    print(f"# step 2 of stream-consumer, consumer.py kept from running ({args.how}) {args.freeze:g} s after the "
          f"flaky order's Nth failure")
    for name, after in cases:
        entry = entries[name]
        expected = entry.expect.get(2, "pass")
        for _ in range(args.repeat):
            got = grade(entry, after, args.freeze, args.stalled_runs)
            ok = got.outcome == expected
            unjudged += got.outcome == "error"
            wrong += not ok and got.outcome != "error"
            mark = "ok " if ok else "err" if got.outcome == "error" else "BAD"
            print(f"{mark} {name:40} N={after} expected {expected:4} got {got.outcome:4} "
                  f"{'' if ok else got.message}", flush=True)
    print(f"# {wrong} wrong verdict(s), {unjudged} not judged (machine too busy)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
