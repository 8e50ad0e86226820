"""Does stream-consumer's step 2 hold when the learner's consumer is stalled mid-wait? Grades step 2 of
corpus entries, freezing consumer.py (SIGSTOP) for S seconds right after the flaky order's Nth failed call,
and prints the verdict beside the one the corpus expects.

    python bench/step2_stall.py                       # the entries and freezes that went wrong before
    python bench/step2_stall.py --freeze 0.6 --after 1 --match not-before-schedule

Why: on a 2-core machine with a slow CPU, bench/load_agreement.py --load --exercise stream-consumer gave
wrong step 2 verdicts both ways (a constant min-idle passed, consumers with a schedule of their own failed):
step 2 judges a growing wait on the gaps between calls when it cannot tell that the consumer claimed the
entry as soon as it was due, and a consumer that gets no CPU for a while makes both the gaps and that
inference wrong. Load makes it likely; a freeze at a chosen moment makes it certain, so this script
reproduces it on a quiet machine in under a minute.

Each grading runs in this process (pytest with the harness's plugin, step 2 only); the freeze is set off
from the call channel's thread when the call reaches the harness. Nothing here asserts; the exit status
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
from pathlib import Path

import pytest

from retrylab import exercise as exercises
from retrylab.checks.stream_consumer import run_retry
from retrylab.fixtures.stream_consumer import corpus
from retrylab.grading import pytest_args
from retrylab.procfs import find_processes
from retrylab.sandbox import RUN_ID_VARIABLE, RUN_TAG_VARIABLE
from retrylab.supervisor import kill

TAG = f"stall{os.getpid()}"
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
    """Stop this script's learner processes for `seconds` (a timer thread lets them go on)."""
    frozen = find_processes(f"{RUN_ID_VARIABLE}={TAG}-")
    kill(frozen, signal.SIGSTOP)
    threading.Timer(seconds, kill, (frozen, signal.SIGCONT)).start()


def _freezing_app(after: int, seconds: float):
    """run_retry's EffectsApp, with on_call wrapped: the flaky order's `after`th failure freezes the consumer."""
    original = run_retry.EffectsApp

    def make(seeded, on_call):
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


def grade(entry, after: int, seconds: float) -> _Verdict:
    exercise = exercises.get("stream-consumer")
    verdict = _Verdict()
    with tempfile.TemporaryDirectory() as folder:
        submission = entry.materialize(Path(folder) / "submission")
        args = [*pytest_args(exercise), "--solution", str(submission), "--backend", "fake", "-q",
                "-k", "test_flaky_entry_reclaimed_after_growing_waits_then_applied_once"]
        saved = run_retry.EffectsApp
        run_retry.EffectsApp = _freezing_app(after, seconds)
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
    args = parser.parse_args()
    os.environ[RUN_TAG_VARIABLE] = TAG
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    entries = {e.id: e for e in corpus.entries()} | {"reference": _Reference}
    cases = [(name, args.after or after) for name, after in DEFAULT_CASES
             if not args.match or any(m in name for m in args.match)]
    if args.match:
        cases += [(i, args.after or 1) for i in entries if any(m in i for m in args.match) and
                  i not in dict(cases)]
    wrong = 0
    print(f"# step 2 of stream-consumer, consumer.py frozen {args.freeze:g} s after the flaky order's Nth failure")
    for name, after in cases:
        entry = entries[name]
        expected = entry.expect.get(2, "pass")
        for _ in range(args.repeat):
            got = grade(entry, after, args.freeze)
            ok = got.outcome == expected
            wrong += not ok
            print(f"{'ok ' if ok else 'BAD'} {name:40} N={after} expected {expected:4} got {got.outcome:4} "
                  f"{'' if ok else got.message}", flush=True)
    print(f"# {wrong} wrong verdict(s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
