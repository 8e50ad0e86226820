"""What the first half of step 7's run (run_durable.py) shows of the consumers' concurrency and waiting:
both are sampled every look (CPU, threads, the shared clock; watch.Sample)."""
from __future__ import annotations

from dataclasses import dataclass

from retrylab.checks.retry_topics import lab

BUSY_CPU = 0.2      # CPU seconds: less than this in a whole wait is no spin, whatever the clock did
# CPU seconds per second of the clock waited through: a waiter that sleeps has ~0.0001; one that pauses and
# polls with a timeout (each empty poll a virtual wait) ~0.003; one that keeps checking the time moves the
# clock only as fast as real time, at whatever share of a CPU the machine gives it (0.1-1)
BUSY_RATE = 0.02


def spins(cpu: float, virtual: float) -> bool:
    return cpu >= BUSY_CPU and cpu / max(virtual, 1e-3) > BUSY_RATE


@dataclass(frozen=True)
class Wait:
    """retry_consumer.py while the target's retry was pending and not due."""
    cpu: float          # CPU seconds it had
    virtual: float      # seconds of the shared clock that went by
    real: float         # real seconds
    retried: bool       # the window ended with the retry (else with the harness's patience)

    @property
    def spins(self) -> bool:
        return spins(self.cpu, self.virtual)


def waiting(run) -> Wait | None:
    """From the target's retry record (produced by consumer.py) to its retry, or to the second batch; None
    when there was no retry record to wait for."""
    start = run.retry_produced_at
    samples = run.first.samples.get(lab.RETRY_SCRIPT, ()) if run.first else ()
    if start is None or not samples:
        return None
    retry = next((c for c in run.first.runs[lab.RETRY_SCRIPT].calls if c.id == run.target), None)
    end = retry.t - retry.offset if retry is not None else run.batch_at
    inside = [s for s in samples if s.at <= start][-1:] + [s for s in samples if start < s.at <= (end or start)]
    if len(inside) < 2:
        return Wait(0.0, 0.0, 0.0, retry is not None)
    first, last = inside[0], inside[-1]
    return Wait(last.cpu - first.cpu, last.virtual - first.virtual, last.at - first.at, retry is not None)


def thread_growth(run, script: str) -> tuple[int, int] | None:
    """(threads just before the second batch, the most while it was handled, until the kill); None when
    the second batch never came."""
    samples = run.first.samples.get(script, ()) if run.first else ()
    if run.batch_at is None or not samples:
        return None
    before = [s.threads for s in samples if s.at <= run.batch_at and s.threads]
    end = run.killed_at or float("inf")
    during = [s.threads for s in samples if run.batch_at < s.at < end and s.threads]
    if not before or not during:
        return None
    return before[-1], max(during)


def ended_in_burst(run, script: str):
    """The script's first run, if it ended by itself (neither killed nor stopped by the harness) once the
    second batch had come: a process that runs out of threads (or of memory for them) ends so."""
    script_run = run.first.runs.get(script) if run.first else None
    if run.batch_at is None or script_run is None or script_run.missing:
        return None
    result = script_run.result
    killed = run.killed_at is not None and result.returncode == -9
    if result.stopped is not None or killed:
        return None
    samples = run.first.samples.get(script, ())
    return script_run if samples and samples[-1].at > run.batch_at else None
