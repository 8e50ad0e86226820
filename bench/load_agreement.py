"""Do verdicts hold on a busy machine? Grades corpus submissions, quiet or under load, and prints
how many steps agree with the verdicts the corpus expects.

    python bench/load_agreement.py                         # quiet: every entry once, fake backend
    python bench/load_agreement.py --load                  # the load that reproduced issue 10
    python bench/load_agreement.py --backend redis-server --load --match worker --match correct/
    python bench/load_agreement.py --exercise stream-consumer --load   # another exercise's corpus

Each grading is `retrylab check DIR --format exercism` in a process of its own, as a user or a
platform runs it. `--load` puts beside the gradings what made correct submissions fail before:
pure CPU load alone did not (issue 10), the mix did:
- `--hogs` CPU-bound processes (default 2);
- `--jobs` gradings at once (default 4 with --load, else 1);
- `--churn` loops that keep starting what a test suite at -n 4 starts: Python interpreters that
  import the harness's dependencies, and private redis-server processes (default 2);
- `--freeze S`: the learner processes of these gradings (and only these: their run ids carry this
  script's tag) are stopped for S seconds (SIGSTOP), let run for one, and so on: what a process that
  gets no CPU for seconds on a busy machine goes through, made certain instead of left to chance
  (default 0: off; 2.5 reproduced the wrong verdicts of issue 10 every time).

Prints one line per grading (entry, agreement, the steps that disagree with what they said), then a
summary per backend. Exits 1 if any step disagrees, so it can gate a change.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from retrylab import brokers
from retrylab import exercise as exercises
from retrylab.procfs import find_processes
from retrylab.sandbox import RUN_ID_VARIABLE, RUN_TAG_VARIABLE
from retrylab.supervisor import kill

TAG = f"loadbench{os.getpid()}"
HOG = "while True: pass"
IMPORTS = "import redis, fakeredis, pytest, time_machine, retrylab.grading"


def retrylab_command() -> list[str]:
    script = Path(sys.executable).with_name("retrylab")
    return [str(script)] if script.exists() else [sys.executable, "-m", "retrylab"]


def corpus_of(exercise_id: str):
    """The exercise's corpus module (fixtures/<id>/corpus.py): entries() with their expected verdicts."""
    return importlib.import_module(f"retrylab.fixtures.{exercise_id.replace('-', '_')}.corpus")


def grade(entry, exercise_id: str, backend: str, scratch: Path) -> tuple[dict[int, str], dict[int, str], float]:
    """(verdict per lab step, message per step, seconds) of one grading in its own process."""
    folder = Path(tempfile.mkdtemp(dir=scratch))
    try:
        submission = entry.materialize(folder / "submission")
        started = time.monotonic()
        done = subprocess.run([*retrylab_command(), "check", str(submission), "--exercise", exercise_id, "--backend", backend,
                               "--format", "exercism", "--exit-zero"],
                              capture_output=True, text=True, timeout=600, env={**os.environ, RUN_TAG_VARIABLE: TAG})
        seconds = time.monotonic() - started
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        tests = json.loads(done.stdout)["tests"]
    except (ValueError, KeyError):
        return {}, {0: (done.stderr or done.stdout)[-300:]}, seconds
    verdicts = {t["task_id"]: t["status"] for t in tests if "task_id" in t}
    messages = {t["task_id"]: t.get("message") or "" for t in tests if "task_id" in t}
    return verdicts, messages, seconds


class Load:
    """CPU hogs and start-up churn (interpreters, private redis-server processes) until stopped."""

    def __init__(self, hogs: int, churn: int, freeze: float = 0.0, thaw: float = 1.0):
        self.hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._churn, args=(i,), daemon=True) for i in range(churn)]
        if freeze:
            self.threads.append(threading.Thread(target=self._freeze, args=(freeze, thaw), daemon=True))
        for thread in self.threads:
            thread.start()

    def _churn(self, index: int) -> None:
        while not self.stopping.is_set():
            if index % 2 == 0 or not shutil.which("redis-server"):
                subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True)
                continue
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.3)
            server.terminate()
            server.wait()

    def _freeze(self, seconds: float, thaw: float) -> None:
        marker = f"{RUN_ID_VARIABLE}={TAG}-"
        while not self.stopping.is_set():
            frozen = find_processes(marker)
            kill(frozen, signal.SIGSTOP)
            self.stopping.wait(seconds)
            kill(frozen, signal.SIGCONT)     # kill() passes over a process that has ended meanwhile
            self.stopping.wait(thaw)

    def stop(self) -> None:
        self.stopping.set()
        for hog in self.hogs:
            hog.send_signal(signal.SIGKILL)
            hog.wait()
        for thread in self.threads:
            thread.join()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exercise", default=exercises.default_id(),
                        help="the exercise whose corpus is graded (default: %(default)s)")
    parser.add_argument("--backend", action="append",
                        help="a backend that starts its own servers (repeatable; default: the broker's embedded one)")
    parser.add_argument("--match", action="append", default=[], metavar="TEXT",
                        help="only entries whose id contains TEXT (repeatable); default all")
    parser.add_argument("--load", action="store_true", help="grade beside CPU hogs and start-up churn")
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--churn", type=int, default=2)
    parser.add_argument("--freeze", type=float, default=0.0, metavar="S",
                        help="with --load: stop these gradings' learner processes S seconds at a time")
    parser.add_argument("--thaw", type=float, default=1.0, metavar="T",
                        help="with --freeze: let them run T seconds between stops (default 1; --freeze 0.04 --thaw "
                             "0.01 runs them a fifth of the time, a learner 5 times slower in every real-time wait)")
    parser.add_argument("--jobs", type=int, help="gradings at once (default 4 with --load, else 1)")
    parser.add_argument("--repeat", type=int, default=1, help="grade each entry this many times")
    args = parser.parse_args(argv)
    exercise = exercises.get(args.exercise)
    broker = brokers.get(exercise.broker)
    backends = args.backend or [broker.default_backend]
    unknown = [b for b in backends if b not in broker.private_backends]
    if unknown:
        parser.error(f"{exercise.id} offers these backends with servers of their own: {', '.join(broker.private_backends)}")
    corpus = corpus_of(exercise.id)
    jobs = args.jobs or (4 if args.load else 1)
    entries = [e for e in corpus.entries() if not args.match or any(m in e.id for m in args.match)]
    work = [(e, b) for b in backends for e in entries for _ in range(args.repeat)]
    loaded = f"{args.hogs} hogs + {args.churn} churn loops + freeze {args.freeze:g} s / thaw {args.thaw:g} s"
    print(f"# {len(work)} gradings, {jobs} at once, load: {loaded if args.load else 'none'}; "
          f"load average before {os.getloadavg()[0]:.1f}", flush=True)
    load = Load(args.hogs, args.churn, args.freeze, args.thaw) if args.load else None
    totals = {b: [0, 0, 0, 0.0] for b in backends}   # steps agreeing, steps, gradings all agreeing, seconds
    peak = 0.0
    with tempfile.TemporaryDirectory(prefix="retrylab-load-") as scratch, \
            concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(grade, e, exercise.id, b, Path(scratch)): (e, b) for e, b in work}
        try:
            for future in concurrent.futures.as_completed(futures):
                entry, backend = futures[future]
                verdicts, messages, seconds = future.result()
                peak = max(peak, os.getloadavg()[0])
                wrong = {n: verdicts.get(n, "missing") for n, want in entry.expect.items() if verdicts.get(n) != want}
                agree = len(entry.expect) - len(wrong)
                total = totals[backend]
                total[0] += agree
                total[1] += len(entry.expect)
                total[2] += not wrong
                total[3] += seconds
                print(f"{'ok ' if not wrong else 'BAD'} {backend:12} {entry.id:50} {agree}/{len(entry.expect)} "
                      f"{seconds:5.1f}s", flush=True)
                for number, got in sorted(wrong.items()):
                    text = (messages.get(number) or messages.get(0) or "").strip().splitlines()
                    print(f"      step {number}: expected {entry.expect[number]}, got {got}: "
                          f"{text[0][:200] if text else ''}", flush=True)
        finally:
            if load:
                load.stop()
    print(f"# summary (peak 1-min load average {peak:.1f})")
    for backend, (agree, steps, whole, seconds) in totals.items():
        count = sum(1 for _, b in work if b == backend)
        print(f"{backend:12} steps agreeing {agree}/{steps}; gradings fully agreeing {whole}/{count}; "
              f"mean {seconds / max(1, count):.1f} s per grading")
    return 0 if all(t[0] == t[1] for t in totals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
