"""The container backend on a live Docker engine: grade the reference solution N times in a row.

    python bench/container_bench.py [--runs 10]

Each run is `retrylab check <reference> --backend container --format exercism` as a user runs it
(probe, containers, grading, removal). Prints how many runs passed all 8 lab steps, the wall time
per grading (median, min, max), the 1-minute load average before and after, and any failed run's
first failing step. Checks that no container of a finished run is left. Nothing here asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from retrylab.brokers.redis import containers
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE


def grade_once() -> tuple[bool, float, str, int]:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "retrylab", "check", str(REFERENCE), "--backend", "container",
                             "--format", "exercism"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=300)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        try:
            failed = next(t for t in json.loads(stdout)["tests"] if t["status"] != "pass")
            why = f"{failed['name']}: {' '.join(failed.get('message', '').split())[:300]}"
        except (ValueError, StopIteration, KeyError):
            why = " ".join(stderr.split())[-300:]
        return False, seconds, why, proc.pid
    return True, seconds, "", proc.pid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    engine = containers.docker_engine()
    load_before = os.getloadavg()[0]
    times, failures, leftovers = [], [], 0
    for index in range(args.runs):
        passed, seconds, why, pid = grade_once()
        times.append(seconds)
        leftovers += len(engine.api.containers(all=True, filters={"label": f"{containers.LABEL_PID}={pid}"}))
        print(f"run {index + 1}: {'pass' if passed else 'FAIL'} {seconds:.1f} s {why}", flush=True)
        if not passed:
            failures.append(why)
    print(f"\n{args.runs - len(failures)}/{args.runs} gradings passed; seconds per grading: median"
          f" {statistics.median(times):.1f}, min {min(times):.1f}, max {max(times):.1f}; load average"
          f" {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; containers left: {leftovers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
