"""How grading holds up against hostile submissions: time and peak memory per fixture, and what the
containment of one learner run costs.

    python bench/hostile_bench.py [--backend fake] [NAME ...]

Each hostile fixture (fixtures/submissions/hostile) is graded in a fresh process. Peak memory is the
largest sum of the RSS of that process and all its descendants (the supervisor, the learner's
script and everything it started), sampled from /proc every 20 ms; "largest process" is
the largest ru_maxrss of the grading process and of every process it (or a supervisor) waited for. Prints
markdown tables; not a test (the numbers depend on the machine and its load).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from retrylab import procfs, sandbox
from retrylab.containment import Containment
from retrylab.fixtures.backoff_dlq import corpus

GRADE = """
import json, resource, sys, time
from pathlib import Path
from retrylab.grading import grade
started = time.monotonic()
report = grade(Path(sys.argv[1]), backend=sys.argv[2])
print(json.dumps({"seconds": time.monotonic() - started,
                  "verdicts": {str(r.number): r.status for r in report.lab_results},
                  "largest_kb": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                    resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss),
                  "errors": [r.name for r in report.results if r.status == "error"] + ([report.harness_error] if report.harness_error else [])}))
"""


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class TreeSampler:
    """The peak, over time, of the summed RSS of a process and its descendants."""

    def __init__(self, pid: int, every: float = 0.02):
        self.pid, self.every = pid, every
        self.peak_kb = 0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            tree = [self.pid, *procfs.descendants(self.pid)]
            self.peak_kb = max(self.peak_kb, sum(_rss_kb(p) for p in tree))
            self.peak_processes = max(self.peak_processes, len(tree))
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def grade_entry(entry: corpus.CorpusEntry, backend: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="retrylab-bench-") as tmp:
        submission = entry.materialize(Path(tmp) / "submission")
        tag = f"bench-{uuid.uuid4().hex}"
        env = {**os.environ, sandbox.RUN_TAG_VARIABLE: tag}
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", GRADE, str(submission), backend], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        with TreeSampler(proc.pid) as sampler:
            out, _ = proc.communicate()
        wall = time.monotonic() - started
        result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"seconds": wall, "verdicts": {}, "errors": ["no report"]}
        verdicts = {int(k): v for k, v in result["verdicts"].items()}
        return {"name": entry.name, "seconds": result["seconds"], "wall": wall, "peak_mb": sampler.peak_kb / 1024,
                "largest_mb": result.get("largest_kb", 0) / 1024, "processes": sampler.peak_processes,
                "expected": verdicts == entry.expect and not result["errors"], "bound": entry.max_seconds,
                "left": len(procfs.find_processes(tag))}


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def containment_costs(rounds: int = 7) -> list[tuple[str, float]]:
    """Median seconds for one learner run of a script that does nothing, per containment."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="retrylab-bench-") as tmp:
        folder = Path(tmp) / "submission"
        folder.mkdir()
        (folder / "noop.py").write_text("pass\n")
        with sandbox.Sandbox(folder) as box:  # the bare interpreter with the learner site, for scale
            env = box.environment({})
            times = []
            for _ in range(rounds):
                t = time.monotonic()
                subprocess.run([sys.executable, "noop.py"], cwd=box.workdir, env=env, check=True)
                times.append(time.monotonic() - t)
            rows.append(("plain subprocess (no containment)", _median(times)))
        detected = sandbox.containment()
        variants = [("supervisor only (no own uid, no cgroup)", Containment()),
                    ("supervisor + pids cgroup", Containment(cgroups=detected.cgroups)),
                    (f"detected here: {detected.describe().splitlines()[0]}", detected)]
        for label, variant in variants:
            times = []
            for _ in range(rounds):
                t = time.monotonic()
                with sandbox.Sandbox(folder, containment=variant) as box:
                    box.run("noop.py", env={}, timeout=30)
                times.append(time.monotonic() - t)
            rows.append((label, _median(times)))
    return rows


def stop_latency(rounds: int = 3) -> float:
    """Seconds from the harness deciding to stop a script that ignores SIGTERM to the run returning."""
    with tempfile.TemporaryDirectory(prefix="retrylab-bench-") as tmp:
        folder = Path(tmp) / "submission"
        folder.mkdir()
        (folder / "stubborn.py").write_text(
            "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\nwhile True: pass\n")
        latencies = []
        for _ in range(rounds):
            with sandbox.Sandbox(folder) as box:
                started, decided = [], []

                def stop() -> bool:  # half a second after the script started: it ignores SIGTERM by then
                    if not started and len(procfs.descendants(os.getpid())) >= 2:
                        started.append(time.monotonic())
                    if started and not decided and time.monotonic() - started[0] > 0.5:
                        decided.append(time.monotonic())
                    return bool(decided)

                box.run("stubborn.py", env={}, timeout=30, stop_when=stop, poll=0.01)
                latencies.append(time.monotonic() - decided[0])
        return _median(latencies)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="only these fixtures")
    parser.add_argument("--backend", default="fake")
    args = parser.parse_args()
    print(f"containment here: {sandbox.containment().describe()}\n")
    print("| hostile fixture | verdicts as expected | grading (s) | bound (s) | peak RSS, whole tree (MB) | "
          "largest process (MB) | most processes at once | left after |")
    print("|---|---|---|---|---|---|---|---|")
    for entry in corpus.entries("hostile"):
        if args.names and entry.name not in args.names:
            continue
        row = grade_entry(entry, args.backend)
        print(f"| {row['name']} | {'yes' if row['expected'] else 'NO'} | {row['seconds']:.1f} | {row['bound']:g} | "
              f"{row['peak_mb']:.0f} | {row['largest_mb']:.0f} | {row['processes']} | {row['left']} |", flush=True)
    print("\n| one learner run of `pass` | median (ms) |\n|---|---|")
    for label, seconds in containment_costs():
        print(f"| {label} | {seconds * 1000:.0f} |")
    print(f"\nstopping a script that ignores SIGTERM: {stop_latency():.2f} s from the decision to the run's end "
          f"(grace {sandbox.STOP_GRACE} s, then SIGKILL)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
