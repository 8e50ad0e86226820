"""The sandbox's cost per learner run: the same `pass` script, run N times under each containment
(the uid/rlimits/supervisor one without namespaces, bubblewrap, direct unshare(2)); median and mean
wall time per run in ms, from Sandbox.run's start to its return (interpreter start included).

    python bench/sandbox_cost.py [--runs 20]
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from retrylab import sandbox
from retrylab.sandbox import Sandbox


def measure(containment, folder: Path, runs: int) -> list[float]:
    times = []
    with Sandbox(folder, containment=containment) as box:
        box.run("noop.py", env={}, timeout=60)  # warm the page cache and the mount plan's lookups
        for _ in range(runs):
            started = time.perf_counter()
            result = box.run("noop.py", env={}, timeout=60)
            times.append((time.perf_counter() - started) * 1000)
            assert result.returncode == 0, result.stderr
    return times


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
        for name, containment in variants.items():
            times = measure(containment, Path(folder), args.runs)
            print(f"{name:24} median {statistics.median(times):6.1f} ms   mean {statistics.mean(times):6.1f} ms   "
                  f"min {min(times):6.1f} ms   ({args.runs} runs)")


if __name__ == "__main__":
    main()
