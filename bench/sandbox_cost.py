"""The sandbox's cost per learner run: the same `pass` script, run N times under each containment
(the uid/rlimits/supervisor one without namespaces, bubblewrap, direct unshare(2)), in turn; median,
fastest wall time per run in ms, and CPU time per run (less sensitive to a busy machine), from Sandbox.run's start to its return (the supervisor's
and the learner interpreter's start, with its sitecustomize, included).

    python bench/sandbox_cost.py [--runs 20]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from retrylab import sandbox
from retrylab.sandbox import Sandbox


def measure(variants: dict, folder: Path, runs: int) -> dict[str, list[float]]:
    """Round robin over the variants, so that a load that comes and goes weighs on each alike."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, float] = {name: 0.0 for name in variants}
    with contextlib.ExitStack() as stack:
        boxes = {name: stack.enter_context(Sandbox(folder, containment=c)) for name, c in variants.items()}
        for box in boxes.values():
            box.run("noop.py", env={}, timeout=60)  # warm the page cache and the mount plan's lookups
        for _ in range(runs):
            for name, box in boxes.items():
                before = _children_cpu()
                started = time.perf_counter()
                result = box.run("noop.py", env={}, timeout=60)
                times[name].append((time.perf_counter() - started) * 1000)
                cpu[name] += _children_cpu() - before
                assert result.returncode == 0, result.stderr
    return {name: (times[name], cpu[name] * 1000 / runs) for name in variants}


def _children_cpu() -> float:
    """CPU seconds of every reaped child: the supervisor, which has reaped the run's whole tree."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    detected = sandbox.containment()
    plain = dataclasses.replace(detected, namespaces="", bwrap="")
    variants = {"no namespaces (partial)": plain, "unshare(2)": dataclasses.replace(plain, namespaces="unshare")}
    if shutil.which("bwrap"):
        variants["bubblewrap"] = dataclasses.replace(plain, namespaces="bwrap", bwrap=shutil.which("bwrap"))
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "noop.py").write_text("pass\n")
        for name, (times, cpu) in measure(variants, Path(folder), args.runs).items():
            print(f"{name:24} wall: median {statistics.median(times):6.1f} ms, min {min(times):6.1f} ms;  "
                  f"CPU {cpu:6.1f} ms per run  ({args.runs} runs)")
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
