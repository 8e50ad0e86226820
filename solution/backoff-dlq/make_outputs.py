"""Write schedule.txt, jitter.txt, capped.txt and requeue.out next to this file.

Each file comes from the functions the worker uses, so what the files show is what the worker
does. Needs no Redis:  python make_outputs.py
"""
import os
import time

from retryqueue import backoff, messages
from retryqueue.keys import DELAYED

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


def requeue_demo(policy):
    """A message failing twice, requeued the way the worker does it (retryqueue/worker.py
    _failed): one more attempt counted, first_seen_at kept, parked in the delayed set until due.
    Printed instead of sent, as the Redis command the worker would issue."""
    out = []
    msg = {"id": "sample-1", "kind": "bad", "data": {"n": 1}, "attempts": 0}
    first_seen_at = now = time.time()
    for _ in range(2):
        now += 1.0  # process() ran and raised
        retry = messages.after_failure(msg, first_seen_at)
        wait = policy(retry["attempts"] - 1)
        out.append(f"requeued id={msg['id']} attempts={retry['attempts']} wait={wait:.3f}")
        out.append(f"  ZADD {DELAYED} {now + wait:.3f} {messages.encode(retry)}")
        msg, now = retry, now + wait  # due: moved back to q:tasks and taken again
    return out


def main():
    policy = backoff.policy(1.0, 30.0)
    write("schedule.txt", schedule_lines(backoff.exponential(1.0), range(6)))
    write("capped.txt", schedule_lines(backoff.capped(backoff.exponential(1.0), 30.0), range(9)))
    write("jitter.txt", jitter_values(policy, 3))  # attempt 3: uniform in [0, 8]
    write("requeue.out", requeue_demo(policy))


if __name__ == "__main__":
    main()
