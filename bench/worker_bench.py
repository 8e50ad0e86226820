"""Throughput of the reference worker against the simplest possible worker, RQ and Dramatiq.

Each contender drains the same 20,000 messages (1% of kind "bad", which fail every time and are
tried 5 times each, then dead-lettered) on a private redis-server, with 1 and with 2 worker
processes. Printed as a markdown table (median of --repeat runs).

    python bench/worker_bench.py [--messages 20000] [--repeat 3] [--dramatiq-threads 8] [--only NAME]
    (needs the bench extra: pip install -e '.[bench]')

Contenders:
- simplest: BLPOP, process, RPUSH on failure (bench/contenders/simplest_worker.py). One round
  trip per message and no safety at all: the upper bound of what one round trip allows.
- reference: solution/backoff-dlq/worker.py (reliable fetch, heartbeat, delayed retries, DLQ records).
- RQ: SimpleWorker (jobs run in the worker process; the default Worker forks per job and is
  far slower), Retry(max=4, interval=0), failed jobs in its FailedJobRegistry.
- Dramatiq: Redis broker, actor with max_retries=4, min_backoff=0, max_backoff=0, dead letters
  in its XQ; its default 8 worker threads per process (it prefetches 2 messages per thread; with
  1 thread it is several times slower here).

How they are made equal:
- every contender runs the same process() (bench/standin/taskproc.py): returns at once, raises
  for "bad" and counts the failure in Redis, so each run is checked to make 1,000 failing calls
  (200 messages x 5 attempts) and dead-letter exactly 200;
- backoff is zero for all: the reference with RETRY_BACKOFF_BASE=0 (its delayed retries are
  due at once and promoted within 0.1 s), RQ with interval=0, Dramatiq with min/max_backoff 0;
- logging at WARNING for all; output discarded;
- the clock starts when the messages become visible, not when the processes start: the
  messages are enqueued (each tool's own way) and then hidden by renaming the queue's list;
  the workers are started and registered; the list is renamed back and timing begins. It stops
  when the queue, the retries and the in-flight work are empty and the DLQ holds 200.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from retrylab.brokers.redis.server_process import RedisServerProcess

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STANDIN = HERE / "standin"
CONTENDERS = HERE / "contenders"
STAGING = "bench:staging"
FAILURES = "standin:failures"
ATTEMPTS = 5


def messages(count: int) -> list[dict]:
    return [{"id": f"m{i:05d}", "kind": "bad" if i % 100 == 50 else "good", "data": {"n": i}, "attempts": 0}
            for i in range(count)]


def env_for(url: str, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "HOME")}
    env.update(REDIS_URL=url, STANDIN_COUNT_URL=url, LOG_LEVEL="WARNING",
               PYTHONPATH=os.pathsep.join([str(STANDIN), str(CONTENDERS)]), **extra)
    return env


def push_json(r, key, msgs):
    for start in range(0, len(msgs), 1000):
        r.rpush(key, *(json.dumps(m) for m in msgs[start:start + 1000]))


class Contender:
    name = ""
    queue = "q:tasks"    # the list that holds the messages waiting; hidden until timing starts

    def seed(self, r, url, msgs): ...
    def command(self, url) -> list[str]: ...
    def env(self, url) -> dict[str, str]:
        return env_for(url)
    def ready(self, r, processes) -> bool: ...
    def done(self, r, bad) -> bool: ...
    def started(self, processes) -> int:
        return processes


class Simplest(Contender):
    name = "simplest (BLPOP, process, RPUSH)"

    def seed(self, r, url, msgs):
        push_json(r, STAGING, msgs)

    def command(self, url):
        return [sys.executable, str(CONTENDERS / "simplest_worker.py")]

    def ready(self, r, processes):
        return r.scard("bench:ready") >= processes

    def done(self, r, bad):
        return r.llen("q:tasks") == 0 and r.llen("q:tasks:dlq") == bad


class Reference(Contender):
    name = "reference (solution/backoff-dlq/worker.py)"

    def seed(self, r, url, msgs):
        push_json(r, STAGING, msgs)

    def command(self, url):
        return [sys.executable, str(ROOT / "solution" / "backoff-dlq" / "worker.py")]

    def env(self, url):
        return env_for(url, RETRY_BACKOFF_BASE="0")

    def ready(self, r, processes):
        return r.scard("q:tasks:workers") >= processes

    def done(self, r, bad):
        in_flight = sum(r.llen(k) for k in r.keys("q:tasks:processing:*"))
        return (r.llen("q:tasks") == 0 and r.zcard("q:tasks:delayed") == 0 and in_flight == 0
                and r.llen("q:tasks:dlq") == bad)


class RQ(Contender):
    name = "RQ {version} (SimpleWorker)"
    queue = "rq:queue:default"

    def __init__(self):
        import rq
        self.name = self.name.format(version=rq.__version__)

    def seed(self, r, url, msgs):
        from rq import Queue, Retry
        queue = Queue("default", connection=r)
        for start in range(0, len(msgs), 1000):
            queue.enqueue_many([Queue.prepare_data("rq_tasks.process", (m,), retry=Retry(max=ATTEMPTS - 1, interval=0))
                                for m in msgs[start:start + 1000]])
        r.rename(self.queue, STAGING)

    def command(self, url):
        return [sys.executable, "-m", "rq.cli", "worker", "-w", "rq.worker.SimpleWorker", "-u", url,
                "--logging_level", "WARNING", "--disable-job-desc-logging", "-P", str(CONTENDERS), "default"]

    def ready(self, r, processes):
        return r.scard("rq:workers") >= processes

    def done(self, r, bad):
        return (r.llen(self.queue) == 0 and r.zcard("rq:wip:default") == 0
                and r.zcard("rq:failed:default") == bad and r.zcard("rq:scheduled:default") == 0)


class Dramatiq(Contender):
    name = "Dramatiq {version} (Redis broker, {threads} thread(s)/process)"
    queue = "dramatiq:default"

    def __init__(self, threads):
        import dramatiq
        self.threads = threads
        self.name = self.name.format(version=dramatiq.__version__, threads=threads)

    def seed(self, r, url, msgs):
        import dramatiq
        from dramatiq.brokers.redis import RedisBroker
        broker = RedisBroker(url=url)
        message = dramatiq.Message  # built by hand: no actor needs to be importable here
        for m in msgs:
            broker.enqueue(message(queue_name="default", actor_name="process", args=(m,), kwargs={}, options={}))
        r.rename(self.queue, STAGING)

    def command(self, url):
        return [sys.executable, "-m", "dramatiq", "dramatiq_tasks", "--processes", "{processes}",
                "--threads", str(self.threads), "--path", str(CONTENDERS)]

    def ready(self, r, processes):
        return r.zcard("dramatiq:__heartbeats__") >= processes

    def done(self, r, bad):
        acks = sum(r.scard(k) for k in r.keys("dramatiq:__acks__.*"))
        return (r.llen(self.queue) == 0 and r.llen("dramatiq:default.DQ") == 0 and acks == 0
                and r.zcard("dramatiq:default.XQ") == bad)

    def started(self, processes):
        return 1  # one `dramatiq` command forks the worker processes itself


def run_once(contender: Contender, endpoint, msgs, processes: int) -> float:
    r = endpoint.client()
    r.flushall()
    r.script_flush()
    bad = sum(1 for m in msgs if m["kind"] == "bad")
    contender.seed(r, endpoint.url, msgs)
    command = [part.format(processes=processes) for part in contender.command(endpoint.url)]
    # stderr to a file, not a pipe nobody reads: a tool that logs every failure's traceback
    # would fill the pipe and block
    errors = tempfile.TemporaryFile()
    procs = [subprocess.Popen(command, env=contender.env(endpoint.url), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True)
             for _ in range(contender.started(processes))]
    try:
        deadline = time.monotonic() + 60
        while not contender.ready(r, processes):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                errors.seek(0)
                raise RuntimeError(f"{contender.name} did not start: {errors.read().decode()[-800:]}")
            time.sleep(0.05)
        time.sleep(0.5)  # registered is not necessarily waiting yet
        started = time.perf_counter()
        r.rename(STAGING, contender.queue)
        deadline = time.monotonic() + 600
        while not contender.done(r, bad):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{contender.name} did not finish within 600 s")
            time.sleep(0.005)
        seconds = time.perf_counter() - started
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        errors.close()
    failures = int(r.get(FAILURES) or 0)
    if failures != bad * ATTEMPTS:
        raise RuntimeError(f"{contender.name}: {failures} failing calls, expected {bad * ATTEMPTS}")
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dramatiq-threads", type=int, default=8, help="8 is Dramatiq's default")
    parser.add_argument("--only", action="append", default=[], help="contender name prefix (repeatable)")
    args = parser.parse_args(argv)
    msgs = messages(args.messages)
    contenders = [Simplest(), Reference(), RQ(), Dramatiq(args.dramatiq_threads)]
    if args.only:
        contenders = [c for c in contenders if any(c.name.lower().startswith(o.lower()) for o in args.only)]
    results: dict[tuple[str, int], float] = {}
    with RedisServerProcess() as endpoint:
        for contender in contenders:
            for processes in (1, 2):
                runs = [run_once(contender, endpoint, msgs, processes) for _ in range(args.repeat)]
                results[contender.name, processes] = statistics.median(runs)
                print(f"  {contender.name}, {processes} process(es): "
                      + ", ".join(f"{s:.2f}" for s in runs) + " s", file=sys.stderr)

    bad = sum(1 for m in msgs if m["kind"] == "bad")
    print(f"Draining {len(msgs):,} messages ({bad} failing, {ATTEMPTS} attempts each, zero backoff) on a "
          f"private redis-server; median of {args.repeat} runs; messages/s counts each message once.\n")
    print("| worker | 1 process: s | msg/s | 2 processes: s | msg/s | time vs simplest (1 / 2 proc.) |")
    print("|---|---:|---:|---:|---:|---:|")
    base = {p: results.get((Simplest.name, p)) for p in (1, 2)}
    for contender in contenders:
        one, two = results[contender.name, 1], results[contender.name, 2]
        ratio = " / ".join(f"{results[contender.name, p] / base[p]:.2f}x" if base[p] else "-" for p in (1, 2))
        print(f"| {contender.name} | {one:.2f} | {len(msgs) / one:,.0f} | {two:.2f} | {len(msgs) / two:,.0f} "
              f"| {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
