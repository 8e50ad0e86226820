"""How fast retrylab grades: prints markdown tables.

    python bench/grade_bench.py                 # everything (about 7 minutes on 2 cores)
    python bench/grade_bench.py --batch 0       # skip the batch throughput part
    python bench/grade_bench.py --wait-load 1.0 # first wait (up to 10 min) for a quieter machine
    python bench/grade_bench.py --exercise stream-consumer --batch 0 --no-breakdown   # that exercise's
                                                # reference, median of 5 per backend (target < 4 s)

1. One grading of the reference solution as a user runs it (`retrylab check solution`), on each backend of the
   exercise's broker that starts its own servers (container excepted: bench/container_bench.py): median and max
   wall seconds of N runs, and the median CPU seconds of the whole grading (every process it started, learner
   processes and servers included). Targets (issue 15 and each exercise's issue): backoff-dlq a median of at most
   1.0 s wall and 1.0 CPU-s on either backend; stream-consumer under 4 s, jetstream-dlq under 6 s, retry-topics
   under 20 s (their runs wait real server time: min-idle, BackOff, group joins).
`--exercise ID` measures that exercise (its reference solution, its corpus for the batch part).
2. `retrylab grade-batch` throughput for generated submissions (corpus entries, correct and
   known-wrong, cycled), with --jobs 1 and --jobs 2, each forked from warm processes (the default) and
   `--cold`. Targets on 2 cores (issue 15): --jobs 2 >= 1.8x --jobs 1, and >= 70 submissions a minute.
3. Where one grading's time goes (in-process): each step's seconds, and every learner run, those in a step and
   those beside the steps (in a thread of their own): preparing it (copy, relay), starting the learner's
   process until its first broker command, the run, the wait after its last change before a never-exiting
   script is called settled, cleanup, and the run's CPU.

Timings depend on what else the machine is doing: the 1-minute load average is printed with each
part. Nothing here asserts; the tests assert behaviour, this script measures.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import io
import itertools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from retrylab import brokers, runfs
from retrylab import exercise as exercises
from retrylab.grading import GradingPlugin, pytest_args

# seconds, median wall of one grading of the reference; backoff-dlq also at most CPU_TARGET CPU-seconds
TARGETS = {"backoff-dlq": 1.0, "stream-consumer": 4.0, "jetstream-dlq": 6.0, "retry-topics": 20.0}
CPU_TARGET = {"backoff-dlq": 1.0}
MEASURED_ELSEWHERE = ("container",)   # needs a Docker engine: bench/container_bench.py


class Measured:
    """The exercise being measured: its id, reference solution and corpus (fixtures/<id>/corpus.py)."""

    def __init__(self, exercise_id: str):
        self.exercise = exercises.get(exercise_id)
        self.id = self.exercise.id
        self.corpus = importlib.import_module(f"retrylab.fixtures.{self.id.replace('-', '_')}.corpus")
        self.reference = self.corpus.REFERENCE
        self.target = TARGETS.get(self.id, 3.0)
        self.cpu_target = CPU_TARGET.get(self.id)
        self.broker = brokers.get(self.exercise.broker)
        # the backends that start their own private servers, as `retrylab check` would use them here
        self.backends = tuple(b for b in self.broker.private_backends if b not in MEASURED_ELSEWHERE)

    def command(self, *args: str) -> list[str]:
        return retrylab_command() + [args[0], "--exercise", self.id, *args[1:]]


MEASURED: Measured | None = None      # set by main()


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def retrylab_command() -> list[str]:
    script = Path(sys.executable).with_name("retrylab")  # the console script, as a user runs it
    return [str(script)] if script.exists() else [sys.executable, "-m", "retrylab"]


def count_orphans() -> None:
    """Make this process the reaper of whatever its commands leave behind (PR_SET_CHILD_SUBREAPER): a process
    reparented to init is never waited for here, and its CPU (and that of everything it waited for) would be
    missing from the figures."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def reap_orphans(patience: float = 10.0) -> None:
    """Wait (up to `patience` seconds) for every process a finished command left behind: they are ours
    (count_orphans). One still there after that is a leak, and said."""
    end = time.monotonic() + patience
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            if time.monotonic() > end:
                print("warning: a process the command left behind is still running", file=sys.stderr)
                return
            time.sleep(0.01)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process waited for, down the tree
    return usage.ru_utime + usage.ru_stime


def wall(command: list[str], **kwargs) -> float:
    return timed(command, **kwargs)[0]


def timed(command: list[str], **kwargs) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and every process it waited for)."""
    cpu = children_cpu()
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    seconds = time.monotonic() - started
    reap_orphans()
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}")
    return seconds, children_cpu() - cpu


# -- 1. one grading via the CLI ---------------------------------------------------------------------

def single_grades(runs: int) -> tuple[list[str], dict[str, float]]:
    lines = ["| backend | harness bytecode | runs | median s | max s | target | median CPU s | CPU target "
             "| load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|"]
    medians = {}
    measured = MEASURED
    with tempfile.TemporaryDirectory(prefix="retrylab-bench-pycache-") as prefix:
        settings = bytecode_settings(Path(prefix))
        for backend in measured.backends:
            before = load()
            command = measured.command("check", str(measured.reference), "--backend", backend, "--format", "exercism")
            for _, env in settings:
                wall(command, env=env)  # warm the page cache (and write the bytecode, where asked); not counted
            samples = {name: [] for name, _ in settings}
            for _ in range(runs):       # the settings in turn, run by run: a drift in the machine's speed hits both
                for name, env in settings:
                    samples[name].append(timed(command, env=env))
            for name, _ in settings:
                times, cpus = [w for w, _ in samples[name]], [c for _, c in samples[name]]
                medians.setdefault(backend, statistics.median(times))    # the breakdown's: as installed here
                ok = "met" if statistics.median(times) <= measured.target else "missed"
                cpu = statistics.median(cpus)
                cpu_ok = ("" if measured.cpu_target is None else
                          f"<= {measured.cpu_target:g} ({'met' if cpu <= measured.cpu_target else 'missed'})")
                lines.append(f"| {backend} | {name} | {runs} | {statistics.median(times):.2f} | "
                             f"{max(times):.2f} | <= {measured.target:g} s ({ok}) | {cpu:.2f} | {cpu_ok} | "
                             f"{before} -> {load()} |")
    if len(settings) > 1:
        lines += ["", "Harness bytecode: \"compiled each run\" is this installation as it is (an editable install "
                  "under PYTHONDONTWRITEBYTECODE=1 never caches the harness's bytecode); \"cached\" is the grading "
                  "process as a learner or a grading machine runs it: Python's default from the second run on, or a "
                  "regular `pip install`, which compiles at install time. The bench gives those runs a private "
                  "PYTHONPYCACHEPREFIX, written by their uncounted first run (nothing is written in the checkout); "
                  "learner processes compile the harness's learner-side modules in both (they never write bytecode). "
                  "The two settings alternate run by run."]
    return lines, medians


def bytecode_settings(prefix: Path) -> list[tuple[str, dict | None]]:
    """The ways to run the CLI measured: as installed here, and, where that compiles the harness in every run,
    also with its bytecode cached (in `prefix`, not in the checkout)."""
    if harness_bytecode_cached():
        return [("cached", None)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(prefix)
    return [("compiled each run", None), ("cached", env)]


# -- 2. batch throughput ----------------------------------------------------------------------------

def make_batch(root: Path, count: int) -> dict:
    """`count` submissions: the corpus (correct and known-wrong entries alternating), cycled."""
    corpus = MEASURED.corpus
    correct, wrong = corpus.entries("correct"), corpus.entries("wrong")
    mixed = [e for pair in itertools.zip_longest(correct, wrong) for e in pair if e is not None]
    made = {}
    for n, entry in zip(range(count), itertools.cycle(mixed)):
        name = f"{n:03}-{entry.name}"
        entry.materialize(root / name)
        made[name] = entry
    return made


def batch_throughput(count: int) -> list[str]:
    lines = ["| gradings | jobs | submissions | wall s | submissions/min | speed-up | speed-up ceiling "
             "| CPU s per submission | cores busy | verdicts as expected | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    slugs = {s.number: s.slug for s in MEASURED.exercise.steps}
    with tempfile.TemporaryDirectory(prefix="retrylab-bench-") as tmp:
        made = make_batch(Path(tmp) / "submissions", count)
        kinds = sum(e.kind == "correct" for e in made.values())
        base = base_busy = None    # rate and cores busy of the same kind of gradings at --jobs 1 (measured first)
        for mode, jobs in batch_settings():
            out = Path(tmp) / f"gradebook-{mode}-{jobs}.csv"
            before, cpu = load(), children_cpu()
            seconds = wall(MEASURED.command("grade-batch", str(Path(tmp) / "submissions"), "--jobs", str(jobs),
                                            "--out", str(out), *(("--cold",) if mode == "cold" else ())))
            cpu = children_cpu() - cpu
            with out.open(newline="") as f:
                rows = {r["id"]: r for r in csv.DictReader(f)}
            agree = 0
            for name, entry in made.items():
                got = {n: rows.get(name, {}).get(f"step{n}_{slugs[n]}") for n in entry.expect}
                if got == entry.expect:
                    agree += 1
                else:
                    notes.append(f"- {mode}, jobs {jobs}: {name}: expected {entry.expect}, got {got} "
                                 f"({rows.get(name, {}).get('reason', 'no row')})")
            rate = count / seconds * 60
            if jobs == 1:
                base, base_busy = rate, cpu / seconds
            ceiling = "-" if jobs == 1 else f"{speed_up_ceiling(jobs, base_busy):.2f}x"
            target = "" if jobs != 2 else (" (target 1.8x: met)" if rate / base >= 1.8 else " (target 1.8x: missed)")
            per_minute = f"{rate:.1f}" + ("" if (mode, jobs) != ("warm", 2) else
                                          " (target 70: met)" if rate >= 70 else " (target 70: missed)")
            lines.append(f"| {mode} | {jobs} | {count} ({kinds} correct) | {seconds:.1f} | {per_minute} | "
                         f"{rate / base:.2f}x{target} | {ceiling} | {cpu / count:.2f} | {cpu / seconds:.2f} | "
                         f"{agree}/{count} "
                         f"| {before} -> {load()} |")
    lines += ["", "CPU s: user+system time of every process of the batch (graders, learner templates and scripts, "
              "servers; those it left to end by themselves too: the bench is their reaper). "
              f"Cores busy = CPU s / wall s ({os.cpu_count()} is all of this machine; what other programs "
              "use is not counted, the load average shows it). Speed-up ceiling: the most --jobs N could give over "
              "--jobs 1 here, min(N, cores) / (cores busy at --jobs 1): one grading at a time already keeps more "
              "than one core busy (its learner processes and servers run beside the grading process, and its "
              "early runs beside its steps), and N gradings cannot use more cores than there are."]
    return lines + ([""] + notes if notes else [])


def batch_settings() -> list[tuple[str, int]]:
    """The batches measured: warm and cold gradings at --jobs 1 and 2 (the issue's targets), and warm ones at one
    job more than there are cores: a grading waits at times (its learners' runs settle, servers answer), and a
    job beside the cores fills those waits, which --jobs 2 on 2 cores cannot."""
    extra = (os.cpu_count() or 1) + 1
    return [("warm", 1), ("warm", 2), *((("warm", extra),) if extra > 2 else ()), ("cold", 1), ("cold", 2)]


def speed_up_ceiling(jobs: int, busy_at_one_job: float) -> float:
    """The largest speed-up of --jobs `jobs` over --jobs 1 this machine allows, were every core kept busy and
    each submission to cost the CPU it cost at --jobs 1 (issue 15: on 2 cores, 2 / 1.17 = 1.71)."""
    return min(jobs, os.cpu_count() or 1) / busy_at_one_job


# -- 3. where the time goes -------------------------------------------------------------------------

class _Timings(GradingPlugin):
    """The grading's own record of each check's phases (seconds per step), and the learner runner's record of
    every learner run (RunTiming), those in a thread beside the steps too."""

    learner = None

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        value = yield
        if fixturedef.argname == "learner":
            self.learner = value
        return value

    @property
    def step_seconds(self) -> dict[int | str, float]:
        return {key: sum(p.report.duration for p in phases) for key, phases in self.by_check.items()}

    def runs(self) -> dict[tuple[str, str, int], object]:
        """Each learner run, keyed (harness thread, script, its ordinal among that thread's runs of it)."""
        seen: dict[tuple[str, str], int] = {}
        keyed = {}
        for timing in (self.learner.timings if self.learner else ()):
            n = seen[timing.thread, timing.script] = seen.get((timing.thread, timing.script), 0) + 1
            keyed[timing.thread, timing.script, n] = timing
        return keyed


def _grade_in_process(backend: str) -> tuple[float, _Timings]:
    exercise = MEASURED.exercise
    collector = _Timings(exercise)
    args = [*pytest_args(exercise), "--solution", str(MEASURED.reference), "--backend", backend]
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        pytest.main(args, plugins=[collector])
    return time.monotonic() - started, collector


def _backend_costs(backend: str, n: int = 20) -> tuple[float, float]:
    """(backend start+stop per grading, one check's private server taken and given back), medians."""
    starts, privates = [], []
    for _ in range(5):
        b = MEASURED.broker.make_backend(backend)
        t = time.monotonic()
        b.start()
        b.stop()
        starts.append(time.monotonic() - t)
    b = MEASURED.broker.make_backend(backend)
    b.start()
    try:
        for _ in range(n):
            t = time.monotonic()
            with b.private():
                pass
            privates.append(time.monotonic() - t)
    finally:
        b.stop()
    return statistics.median(starts), statistics.median(privates)


def _where(thread: str) -> str:
    return "a step" if thread == "MainThread" else f"beside ({thread})"


def breakdown(runs: int, cli_medians: dict[str, float]) -> list[str]:
    med = statistics.median
    imports = med(wall([sys.executable, "-c", "import retrylab.cli, retrylab.grading"]) for _ in range(runs))
    lines = [f"Starting the CLI (interpreter and imports: `import retrylab.cli, retrylab.grading`): "
             f"{imports:.2f} s (median of {runs}).", ""]
    for backend in MEASURED.backends:
        _grade_in_process(backend)  # warm-up
        samples = [_grade_in_process(backend) for _ in range(runs)]
        totals = [s for s, _ in samples]
        start, private = _backend_costs(backend)
        lines += [f"**{backend}** (medians of {runs}; load {load()}): CLI {cli_medians.get(backend, float('nan')):.2f} s;"
                  f" in-process grading {med(totals):.2f} s, of which pytest start, collection and teardown"
                  f" {med(totals) - med(sum(t.step_seconds.values()) for _, t in samples):.2f} s and the steps below."
                  f" {MEASURED.broker.shown_name or MEASURED.broker.kind}: backend start+stop {start * 1000:.0f} ms"
                  f" per grading, one check's private server {private * 1000:.0f} ms.", "",
                  "| step | step s |", "|---|---|"]
        steps = sorted({k for _, t in samples for k in t.step_seconds}, key=str)
        for step in steps:
            lines.append(f"| {step} | {med(t.step_seconds.get(step, 0.0) for _, t in samples):.3f} |")
        lines += ["", "| learner run | run in | runs | prepare (copy, relay) s | process start to 1st broker command s "
                  "| run s | of which settle wait s | cleanup s | CPU s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        learner_runs = [t.runs() for _, t in samples]
        keys = sorted({k for sample in learner_runs for k in sample}, key=lambda k: (k[0] != "MainThread", k))
        for thread, script, n in keys:
            mine = [sample[thread, script, n] for sample in learner_runs if (thread, script, n) in sample]
            first = [r.first_command for r in mine if r.first_command is not None]
            cpu = [r.cpu for r in mine if r.cpu is not None]
            lines.append(f"| {script} #{n} | {_where(thread)} | {len(mine)} | {med(r.prepare for r in mine):.3f} | "
                         f"{med(first) if first else float('nan'):.3f} | {med(r.run for r in mine):.3f} | "
                         f"{med(r.settle for r in mine):.3f} | {med(r.cleanup for r in mine):.3f} | "
                         f"{med(cpu) if cpu else float('nan'):.3f} |")
        lines.append("")
    return lines


def harness_bytecode_cached() -> bool:
    """Whether every module of the harness package has bytecode Python would use (present and not stale): a
    partial or stale cache still compiles in every run."""
    import importlib.util
    from retrylab import grading
    for source in Path(grading.__file__).parent.rglob("*.py"):
        cached = Path(importlib.util.cache_from_source(str(source)))
        try:
            header = cached.read_bytes()[:16]
        except OSError:
            return False
        stat = source.stat()
        flags = int.from_bytes(header[4:8], "little")
        if header[:4] != importlib.util.MAGIC_NUMBER or (flags == 0 and (
                int.from_bytes(header[8:12], "little") != int(stat.st_mtime) & 0xFFFFFFFF
                or int.from_bytes(header[12:16], "little") != stat.st_size & 0xFFFFFFFF)):
            return False
    return True


def bytecode_state() -> str:
    """Whether the harness's own modules load from cached bytecode: an editable install under
    PYTHONDONTWRITEBYTECODE=1 never writes it, and each grading then compiles them all (about 0.05 CPU-s and
    as much wall time here, see the README's "How fast"). pip writes it for a regular install."""
    if harness_bytecode_cached():
        return "the harness's modules load from cached bytecode"
    why = " (PYTHONDONTWRITEBYTECODE is set)" if sys.dont_write_bytecode else ""
    return (f"the harness's modules have no cached bytecode{why}: each grading compiles them (the first table "
            "measures that and, apart, runs with it cached)")


def yardstick() -> str:
    """How fast this machine runs plain Python, so that figures from two machines can be compared: the same
    code measured 0.74 s a grading on one 2-core machine of this project and 1.03 s on another."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.perf_counter() - started)
    return f"a 10-million-step Python loop takes {best:.2f} s here (best of 3)"


_LOOP = "for i in range(10_000_000): pass"


def _loops_at_once(count: int) -> float:
    """Wall seconds for `count` interpreters running the loop at once (each started before any runs it)."""
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", _LOOP], stdout=subprocess.DEVNULL) for _ in range(count)]
    for proc in procs:
        proc.wait()
    return time.perf_counter() - started


def parallel_yardstick() -> str:
    """How much faster this machine runs as many CPU-bound processes as it has CPUs than one: the most any
    `--jobs` can give over `--jobs 1`, for work that never waits and shares nothing (a virtual machine's CPUs may
    be hyper-threads, or slowed by its neighbours). Each loop runs in its own interpreter, start-up included."""
    count = min(2, os.cpu_count() or 1)
    one = min(_loops_at_once(1) for _ in range(3))
    many = min(_loops_at_once(count) for _ in range(3))
    return f"{count} such loops at once give {count * one / many:.2f}x one (best of 3)"


def scratch_state() -> str:
    """Where the gradings' temporary folders go (TMPDIR, else /tmp) and on what filesystem, and whether learner runs'
    copies of the submission are on a tmpfs of their own (retrylab.runfs, where the harness may mount): a grading
    creates and removes a few hundred files, and on a disk filesystem that costs CPU (README, "How fast": about a
    tenth of a batch's CPU on this project's machines, whose ext4 has no journal and skips every inode removed in the
    last 30 s when it makes a file)."""
    folder = os.path.realpath(tempfile.gettempdir())
    kind, best = "unknown", ""
    with contextlib.suppress(OSError), open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1].replace("\\040", " ")
            if (folder == point or folder.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                kind, best = fields[2], point
    runs = "a tmpfs of each run's own" if runfs.available() else "the same folder"
    return f"temporary folders in {folder} ({kind}); learner runs' copies on {runs}"


def wait_for_load(limit: float, patience: float = 600) -> None:
    end = time.monotonic() + patience
    while os.getloadavg()[0] > limit and time.monotonic() < end:
        time.sleep(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="gradings per backend (default 5)")
    parser.add_argument("--batch", type=int, default=50, help="submissions in the batch part (0: skip it)")
    parser.add_argument("--wait-load", type=float, metavar="L",
                        help="first wait (up to 10 min) until the 1-minute load average is below L")
    parser.add_argument("--exercise", default=None, help="the exercise whose reference and corpus are measured (default: the default exercise)")
    parser.add_argument("--no-breakdown", action="store_true", help="skip part 3 (where the time goes)")
    args = parser.parse_args()
    global MEASURED
    MEASURED = Measured(args.exercise)
    count_orphans()
    if "redis-server" in MEASURED.backends and shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH: the redis-server rows need it")
    if args.wait_load:
        wait_for_load(args.wait_load)
    print(f"# retrylab grading benchmark: {MEASURED.id}\n\n{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {bytecode_state()}; "
          f"{scratch_state()}; {yardstick()}; {parallel_yardstick()}\n")
    print("## One grading of the reference solution (`retrylab check solution --format exercism`)\n")
    table, medians = single_grades(args.runs)
    print("\n".join(table) + "\n", flush=True)
    if args.batch:
        print(f"## `retrylab grade-batch`: {args.batch} submissions from the corpus\n")
        print("\n".join(batch_throughput(args.batch)) + "\n", flush=True)
    if not args.no_breakdown:
        print("## Where one grading's time goes (reference solution)\n")
        print("\n".join(breakdown(args.runs, medians)))
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
