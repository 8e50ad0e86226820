"""What the advanced checks add to a full `retrylab check` of the reference solution.

    python bench/advanced_checks.py [--runs N] [--backend fake|redis-server] [DIR]

Grades DIR (default: solution/backoff-dlq/) alternately with the 8 lab steps only (as `--step 1 ... --step 8`,
which leaves the advanced checks out) and in full, and prints a markdown table: median wall time of
each, the difference, and the median time each advanced check reports for itself (its setup
included: the shared advanced worker run is paid by the first check that uses it).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

from retrylab.fixtures.backoff_dlq.corpus import REFERENCE
from retrylab.grading import grade

LAB_STEPS = tuple(range(1, 9))


def _cpu() -> float:
    """CPU seconds used so far by this process and its finished children (learner processes)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(run) -> tuple[float, float, object]:
    wall, cpu = time.monotonic(), _cpu()
    result = run()
    return time.monotonic() - wall, _cpu() - cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", type=Path, default=REFERENCE)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backend", default="fake")
    args = parser.parse_args()

    lab, full, per_check = [], [], {}
    for _ in range(args.runs):
        lab.append(_timed(lambda: grade(args.directory, backend=args.backend, steps=LAB_STEPS))[:2])
        wall, cpu, report = _timed(lambda: grade(args.directory, backend=args.backend))
        full.append((wall, cpu))
        for result in report.advanced_results:
            per_check.setdefault(result.name, []).append((result.seconds, result.status))

    def median(samples, index=0):
        return statistics.median(s[index] for s in samples)

    load = os.getloadavg()[0]
    print(f"`retrylab check {args.directory}` on `{args.backend}`, median of {args.runs} runs "
          f"({os.cpu_count()} CPUs, load average {load:.1f} at the end)\n")
    print("| what | wall s | CPU s (harness + learner processes) |")
    print("|---|---|---|")
    print(f"| 8 lab steps only | {median(lab):.2f} | {median(lab, 1):.2f} |")
    print(f"| full (lab + advanced) | {median(full):.2f} | {median(full, 1):.2f} |")
    print(f"| **added by the advanced checks** | **{median(full) - median(lab):.2f}** | "
          f"**{median(full, 1) - median(lab, 1):.2f}** |")
    for name, samples in per_check.items():
        statuses = ", ".join(sorted({status for _, status in samples}))
        print(f"| {name} ({statuses}), wall incl. setup | {statistics.median(s for s, _ in samples):.2f} | |")


if __name__ == "__main__":
    main()
