"""Where retry-topics' step-7 run (run_durable.py) spends its time, per learner session timeout: prints a
markdown table.

    python bench/retry_topics_durable_bench.py                        # 3 runs at 2000 ms (the run's own)
    python bench/retry_topics_durable_bench.py --session 1500 2000 3000 6000 --runs 4 --hogs 2

Per run of the reference: start to both first Fetches (interpreters, imports, the joins), the first half's
work up to the kill, the kill to both restarted consumers' first Fetch (a killed member holds its partitions
until its session times out), the restart's settling, the whole run; whether the verdicts of step 7 and the
two advanced checks held, and the JoinGroup requests of the first half (more than one per script: a
rebalance, e.g. a session that expired on a busy machine). Nothing here asserts; the tests do.
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

from retrylab import i18n
from retrylab.brokers.kafka import BROKER
from retrylab.brokers.kafka.backend import TansuBackend
from retrylab.checks.retry_topics import lab, run_durable
from retrylab.checks.retry_topics.test_advanced_bounded_concurrency import \
    test_a_burst_of_failures_does_not_grow_the_threads as bounded_concurrency
from retrylab.checks.retry_topics.test_advanced_quiet_wait import \
    test_the_retry_consumer_waits_without_spinning as quiet_wait
from retrylab.checks.retry_topics.test_step7_durable import judge
from retrylab.runner import LearnerRunner
from retrylab.verdict import CheckFailed
from retry_topics_bench import hogs     # its sibling: the same CPU hogs

REFERENCE = Path(__file__).resolve().parent.parent / "solution" / "retry-topics"
JOIN_GROUP = 11


def verdicts(run) -> str:
    found = []
    with i18n.use("en"):
        for name, check in (("7", judge), ("bc", bounded_concurrency), ("qw", quiet_wait)):
            try:
                check(run)
                found.append(f"{name}:pass")
            except CheckFailed:
                found.append(f"{name}:FAIL")
    return " ".join(found)


def one(backend, session: int) -> dict:
    run_durable.SESSION_MS = session
    began = time.time()
    run = run_durable.observe_durable(LearnerRunner(REFERENCE, learner_imports=BROKER.learner_imports), backend,
                                      threading.Event())
    ended = time.time()
    first_fetch = max(v for v in run.first.fetching.values() if v) if all(run.first.fetching.values()) else None
    again = run.second.fetching if run.second else {}
    refetch = max(again.values()) if again and all(again.values()) else None
    joins = [sum(1 for r in script_run.commands if r.api_key == JOIN_GROUP) for script_run in run.first.runs.values()]
    return {"fetch": first_fetch - began if first_fetch else None,
            "work": run.killed_at - first_fetch if run.killed_at and first_fetch else None,
            "rejoin": refetch - run.killed_at if refetch and run.killed_at else None,
            "settle": ended - refetch if refetch else None, "total": ended - began,
            "verdicts": verdicts(run), "joins": "/".join(map(str, joins)),
            "load": os.getloadavg()[0]}


def cell(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session", type=int, nargs="+", default=[run_durable.SESSION_MS])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=0)
    args = parser.parse_args()
    backend = TansuBackend()
    backend.start()
    print(f"{lab.MAIN_SCRIPT} and {lab.RETRY_SCRIPT} of the reference, {args.hogs} CPU hog(s) beside\n")
    print("| session ms | run | start→fetch s | work→kill s | kill→refetch s | settle s | total s | verdicts |"
          " JoinGroups (first half) | load |\n|---|---|---|---|---|---|---|---|---|---|")
    try:
        with hogs(args.hogs):
            for session in args.session:
                totals, rejoins = [], []
                for number in range(1, args.runs + 1):
                    row = one(backend, session)
                    totals.append(row["total"])
                    if row["rejoin"] is not None:
                        rejoins.append(row["rejoin"])
                    print(f"| {session} | {number} | {cell(row['fetch'])} | {cell(row['work'])} | {cell(row['rejoin'])}"
                          f" | {cell(row['settle'])} | {cell(row['total'])} | {row['verdicts']} | {row['joins']}"
                          f" | {row['load']:.1f} |", flush=True)
                print(f"| {session} | median | | | {cell(statistics.median(rejoins) if rejoins else None)} | |"
                      f" {cell(statistics.median(totals))} | | | |", flush=True)
    finally:
        backend.stop()


if __name__ == "__main__":
    main()
