"""The sandbox's cost per learner run: the same script (`import redis`, as every backoff-dlq run does), run N
times under each containment (the uid/rlimits/supervisor one without namespaces, bubblewrap, direct unshare(2)),
cold (two fresh interpreters) and warm (forked from the learner template) where it can, in turn; median, fastest
wall time per run in ms, and CPU time per run (less sensitive to a busy machine), from Sandbox.run's start to its
return (the supervisor's and the learner interpreter's start, with its sitecustomize, included; a warm run's
CPU is counted in the template, which reaps it).

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

from retrylab import procfs, sandbox, warmstart
from retrylab.sandbox import Sandbox


def measure(variants: dict, folder: Path, runs: int) -> dict[str, list[float]]:
    """Round robin over the variants, so that a load that comes and goes weighs on each alike."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, float] = {name: 0.0 for name in variants}
    with contextlib.ExitStack() as stack:
        boxes = {name: (stack.enter_context(Sandbox(folder, containment=c)), warm)
                 for name, (c, warm) in variants.items()}
        for box, warm in boxes.values():
            _run(box, warm)  # warm the page cache, the mount plan's lookups, and start the template
        for _ in range(runs):
            for name, (box, warm) in boxes.items():
                before = _cpu()
                started = time.perf_counter()
                _run(box, warm)
                times[name].append((time.perf_counter() - started) * 1000)
                cpu[name] += _cpu() - before
    return {name: (times[name], cpu[name] * 1000 / runs) for name in variants}


def _run(box: Sandbox, warm: bool) -> None:
    os.environ[warmstart.WARM_VARIABLE] = "1" if warm else "0"
    result = box.run("noop.py", env={}, timeout=60)
    assert result.returncode == 0, result.stderr


def _cpu() -> float:
    """CPU seconds of every reaped child (a cold run's supervisor, which has reaped the run's whole tree), and
    of the learner template and what it reaped (warm runs' supervisors)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    template = 0.0
    for current in list(warmstart._templates.values()):
        fields = procfs.stat_fields(current.pid)
        template += sum(int(t) for t in fields[11:15]) / os.sysconf("SC_CLK_TCK") if fields else 0.0
    return usage.ru_utime + usage.ru_stime + template


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    detected = sandbox.containment()
    plain = dataclasses.replace(detected, namespaces="", bwrap="")
    unshare = dataclasses.replace(plain, namespaces="unshare")
    variants = {"no namespaces, cold": (plain, False), "no namespaces, warm": (plain, True),
                "unshare(2), cold": (unshare, False), "unshare(2), warm": (unshare, True)}
    if shutil.which("bwrap"):
        variants["bubblewrap (cold)"] = (dataclasses.replace(plain, namespaces="bwrap", bwrap=shutil.which("bwrap")),
                                         False)
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "noop.py").write_text("import redis\n")
        for name, (times, cpu) in measure(variants, Path(folder), args.runs).items():
            print(f"{name:24} wall: median {statistics.median(times):6.1f} ms, min {min(times):6.1f} ms;  "
                  f"CPU {cpu:6.1f} ms per run  ({args.runs} runs)")
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
