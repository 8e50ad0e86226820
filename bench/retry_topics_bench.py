"""How fast retry-topics grades its reference, and where the time goes: prints markdown tables.

    python bench/retry_topics_bench.py                  # 5 gradings, then 5 main runs in-process
    python bench/retry_topics_bench.py --hogs 2         # the same with 2 CPU hogs beside it (killed after)
    python bench/retry_topics_bench.py --runs 3 --no-breakdown

1. `retrylab check --exercise retry-topics solution/retry-topics --format exercism`, as a user runs it: wall
   seconds of each grading (median, max) and the verdicts of steps 1-6 (target: median under 20 s for the
   whole grading; step 7 runs in parallel beside the main run).
2. The main run in-process (run_main.observe_main), per run: the containment probe and interpreter start
   (start to the first Fetch), the group joins, the pair's work and settling, stopping, reading the broker.
Nothing here asserts; the tests assert behaviour, this script measures.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "solution" / "retry-topics"
LAB_STEPS = {1, 2, 3, 4, 5, 6}


@contextlib.contextmanager
def hogs(count: int):
    """`count` busy processes beside the measurement, always killed after it."""
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def gradings(runs: int) -> None:
    print("| run | wall s | steps 1-6 | key-order | load |\n|---|---|---|---|---|")
    walls = []
    for number in range(1, runs + 1):
        began = time.monotonic()
        done = subprocess.run([str(Path(sys.executable).with_name("retrylab")), "check", "--exercise", "retry-topics",
                               str(REFERENCE), "--format", "exercism", "--exit-zero"], capture_output=True, text=True)
        walls.append(time.monotonic() - began)
        try:
            report = json.loads(done.stdout)
        except ValueError:
            print(f"| {number} | {walls[-1]:.1f} | no report: {done.stderr.strip()[-200:]} | | |")
            continue
        results = report.get("tests") or []     # Exercism v3: task_id is the lab step's number
        lab = {r.get("task_id"): r.get("status") for r in results if r.get("task_id") in LAB_STEPS}
        key_order = next((r.get("status") for r in results if "key-order" in str(r.get("name", ""))), "-")
        verdicts = " ".join(f"{n}:{lab.get(n, '-')}" for n in sorted(LAB_STEPS))
        print(f"| {number} | {walls[-1]:.1f} | {verdicts} "
              f"| {key_order} | {os.getloadavg()[0]:.1f} |")
    print(f"\nmedian {statistics.median(walls):.1f} s, max {max(walls):.1f} s over {runs} gradings\n")


def breakdown(runs: int) -> None:
    from retrylab.brokers.kafka import BROKER
    from retrylab.brokers.kafka.backend import TansuBackend
    from retrylab.checks.retry_topics import lab
    from retrylab.checks.retry_topics.run_main import observe_main
    from retrylab.runner import LearnerRunner
    backend = TansuBackend()
    backend.start()
    print("| run | to first Fetch (main / retry) s | of which start (prepare + first command) s | settle s | stop s "
          "| read s | total s | why it stopped |\n|---|---|---|---|---|---|---|---|")
    try:
        for number in range(1, runs + 1):
            learner = LearnerRunner(REFERENCE, application="retrylab.fixtures.retry_topics.notifier_app:NotifierApp",
                                    learner_imports=BROKER.learner_imports)
            began = time.monotonic()
            run = observe_main(learner, backend, threading.Event())
            total = time.monotonic() - began
            fetch = run.times.fetching
            start = [f"{r.timing.prepare + (r.timing.first_command or 0):.1f}" for r in (run.main, run.retry) if r.timing]
            print(f"| {number} | {fetch.get(lab.MAIN_SCRIPT, float('nan')):.1f} / {fetch.get(lab.RETRY_SCRIPT, float('nan')):.1f} "
                  f"| {' / '.join(start)} | {run.times.settle:.1f} | {run.times.stop:.1f} | {run.read_seconds:.1f} "
                  f"| {total:.1f} | {run.stop.reason.value if run.stop else '-'} |")
    finally:
        backend.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hogs", type=int, default=0, help="CPU hogs to run beside the measurement")
    parser.add_argument("--no-breakdown", action="store_true")
    args = parser.parse_args()
    with hogs(args.hogs):
        print(f"## retry-topics reference, {args.hogs} CPU hogs beside it\n")
        gradings(args.runs)
        if not args.no_breakdown:
            breakdown(args.runs)


if __name__ == "__main__":
    main()
