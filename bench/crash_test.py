"""Crash test of the reference worker: SIGKILL it at random moments, restart it, lose nothing.

On a private redis-server: 1,000 messages (10% of kind "bad", which always fail), one worker
process at a time (solution/backoff-dlq/worker.py with a stand-in taskproc that records every call in
Redis), killed with SIGKILL at a random moment 50 times and restarted each time, then one last
worker left to finish and stopped with SIGTERM. At the end every good message must have been
processed and every bad one must be in the DLQ (attempts 5): zero lost. A message may be
processed twice only if a kill hit while it was in flight: its earlier call must be the last
call of a killed worker.

Real time, short settings: backoff base 20 ms (cap 100 ms), each call 5 ms, heartbeat TTL
1.5 s (a killed worker's in-flight message is recovered within about 2 s).

    python bench/crash_test.py [--kills 50] [--messages 1000] [--seed N]

Prints the figures as a markdown table; exits 1 if a message was lost or a duplicate is not
explained by a kill.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import redis

from retrylab.brokers.redis.server_process import RedisServerProcess

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "solution" / "backoff-dlq" / "worker.py"
STANDIN = Path(__file__).resolve().parent / "standin"
CALLS = "standin:calls"
QUEUE, DLQ, DELAYED, WORKERS = "q:tasks", "q:tasks:dlq", "q:tasks:delayed", "q:tasks:workers"


def worker_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "HOME")}
    env.update(REDIS_URL=url, PYTHONPATH=str(STANDIN), LOG_LEVEL="WARNING",
               RETRY_BACKOFF_BASE="0.02", RETRY_BACKOFF_CAP="0.1", WORKER_HEARTBEAT_TTL="1.5",
               STANDIN_SECONDS="0.005", STANDIN_RECORD_URL=url)
    return env


def start_worker(env, stderr) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER)], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=stderr)


def seed(r: redis.Redis, count: int, rng: random.Random) -> dict[str, str]:
    kinds = {f"m{i:05d}": "bad" if i % 10 == 0 else "good" for i in range(count)}
    order = list(kinds)
    rng.shuffle(order)
    r.rpush(QUEUE, *(json.dumps({"id": i, "kind": kinds[i], "data": {"n": n}, "attempts": 0})
                     for n, i in enumerate(order)))
    return kinds


def outstanding(r: redis.Redis) -> int:
    """Messages not yet finished: queued, parked for a retry, or in a processing list."""
    in_flight = sum(r.llen(key) for key in r.scan_iter("q:tasks:processing:*"))
    return r.llen(QUEUE) + r.zcard(DELAYED) + in_flight


def analyse(r: redis.Redis, kinds: dict[str, str], killed: set[int]) -> dict:
    calls = [json.loads(c) for c in r.lrange(CALLS, 0, -1)]
    last_call_of = {}
    for n, call in enumerate(calls):
        last_call_of[call["pid"]] = n
    # a call was in flight at a kill if it was the last thing a killed worker did
    in_flight_at_kill = {n for pid, n in last_call_of.items() if pid in killed}

    ok_calls = defaultdict(list)
    all_calls = defaultdict(list)
    for n, call in enumerate(calls):
        all_calls[call["id"]].append(n)
        if call["ok"]:
            ok_calls[call["id"]].append(n)
    entries = [json.loads(e) for e in r.lrange(DLQ, 0, -1)]
    dead = Counter(e["payload"]["id"] for e in entries)

    goods = [i for i, k in kinds.items() if k == "good"]
    bads = [i for i, k in kinds.items() if k == "bad"]
    lost = [i for i in goods if not ok_calls[i]] + [i for i in bads if not dead[i]]
    duplicates = sum(len(ok_calls[i]) - 1 for i in goods if ok_calls[i])
    # every call of a good message before its last one must have been cut short by a kill
    unexplained = [i for i in goods for n in ok_calls[i][:-1] if n not in in_flight_at_kill]
    # a bad message has 5 attempts; any extra one must likewise be a call a kill interrupted
    extra_bad = sum(max(0, len(all_calls[i]) - 5) for i in bads)
    unexplained_bad = [i for i in bads if len(all_calls[i]) - 5 >
                       sum(1 for n in all_calls[i] if n in in_flight_at_kill)]
    return {
        "messages": len(kinds), "good": len(goods), "bad": len(bads),
        "processed": sum(1 for i in goods if ok_calls[i]),
        "dlq": len(dead), "dlq entries": len(entries),
        "dlq entries with attempts=5": sum(1 for e in entries if e.get("attempts") == 5),
        "good messages in dlq": sum(1 for i in goods if dead[i]),
        "lost": len(lost), "duplicates": duplicates,
        "duplicates not explained by a kill": len(unexplained),
        "extra attempts of bad messages (in flight at a kill)": extra_bad,
        "extra attempts not explained by a kill": len(unexplained_bad),
        "process() calls": len(calls),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    seed_value = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed_value)

    started = time.monotonic()
    # stderr of every worker to one file (a pipe nobody reads could fill and block a worker)
    with RedisServerProcess() as endpoint, tempfile.TemporaryFile() as stderr_file:
        r = endpoint.client()
        kinds = seed(r, args.messages, rng)
        env = worker_env(endpoint.url)
        killed: set[int] = set()
        kills_with_work_left = caught_in_flight = 0
        for _ in range(args.kills):
            proc = start_worker(env, stderr_file)
            time.sleep(rng.uniform(0.15, 0.6))  # start-up takes ~0.1 s: most kills land mid-work
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed.add(proc.pid)
            kills_with_work_left += outstanding(r) > 0
            # its processing list (named host:pid:random) holds the message it was working on
            caught_in_flight += sum(r.llen(key) for key in r.scan_iter(f"q:tasks:processing:*:{proc.pid}:*"))

        last = start_worker(env, stderr_file)  # finishes the work, recovering what the killed ones held
        deadline = time.monotonic() + 120
        while outstanding(r) and time.monotonic() < deadline and last.poll() is None:
            time.sleep(0.05)
        time.sleep(0.2)
        last.send_signal(signal.SIGTERM)
        try:
            last_status = last.wait(timeout=10)
        except subprocess.TimeoutExpired:
            last.kill()
            last_status = "did not stop on SIGTERM"
        stderr_file.seek(0)
        stderr = stderr_file.read().decode(errors="replace")
        figures = analyse(r, kinds, killed)
        figures.update({"kills (SIGKILL)": len(killed), "kills that left work unfinished": kills_with_work_left,
                        "messages in flight at a kill (recovered later)": caught_in_flight,
                        "left in queue/delayed/processing": outstanding(r),
                        "workers still registered": r.scard(WORKERS),
                        "last worker's exit status on SIGTERM": last_status,
                        "seconds": round(time.monotonic() - started, 1), "seed": seed_value})

    print("| figure | value |\n|---|---|")
    for name, value in figures.items():
        print(f"| {name} | {value} |")
    if stderr.strip():
        print("\nworkers' stderr:\n" + stderr[-2000:])
    bad = (figures["lost"] or figures["duplicates not explained by a kill"]
           or figures["extra attempts not explained by a kill"] or figures["left in queue/delayed/processing"]
           or figures["good messages in dlq"] or figures["dlq entries"] != figures["bad"]
           or figures["dlq entries with attempts=5"] != figures["bad"] or last_status != 0)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
