"""Write schedule.txt, jitter.txt, capped.txt and requeue.out next to this file.

Each file comes from the same functions the worker uses, so what the files
show is what the worker does. Needs no Redis:  python make_outputs.py
"""
import json
import os
import time

from backoff import capped, exponential
from worker import POLICY, requeue

HERE = os.path.dirname(os.path.abspath(__file__))


def write(name, lines):
    with open(os.path.join(HERE, name), "w") as f:
        f.write("".join(f"{line}\n" for line in lines))


def schedule_lines(strategy, attempts):
    # :g prints 1.0 as 1 and 32.0 as 32
    return [f"attempt={n} wait={strategy(n):g}" for n in attempts]


def jitter_values(strategy, attempt, count=20, distinct=15):
    # Full jitter rarely repeats a value at 3 decimals; if it happens, draw again
    # rather than write a file that looks like broken jitter.
    while True:
        values = [round(strategy(attempt), 3) for _ in range(count)]
        if len(set(values)) >= distinct:
            return values


def requeue_demo():
    # A message failing twice, sent through the worker's own requeue(): a list
    # stands in for Redis and sleeping is skipped (the wait is still drawn).
    out, pushed = [], []
    msg = {"id": "sample-1", "kind": "bad", "data": {"n": 1}, "attempts": 0}
    first_seen_at = time.time()
    for _ in range(2):
        requeue(msg, first_seen_at, push=lambda key, text: pushed.append((key, text)),
                sleep=lambda s: None, log=out.append)
        key, text = pushed[-1]
        out.append(f"  RPUSH {key} {text}")
        msg = json.loads(text)  # the next delivery sees what was pushed
    return out


def main():
    write("schedule.txt", schedule_lines(exponential(1.0), range(6)))
    write("capped.txt", schedule_lines(capped(exponential(1.0), 30.0), range(9)))
    write("jitter.txt", jitter_values(POLICY, 3))  # attempt 3: uniform in [0, 8]
    write("requeue.out", requeue_demo())


if __name__ == "__main__":
    main()
