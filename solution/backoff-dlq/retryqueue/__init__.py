"""A small, reliable Redis work queue with retries: the reference solution's engine.

One concern per module, in the order a message meets them:

    keys        the Redis key layout, in one place
    messages    decoding a queued message and the bookkeeping it carries (attempts, first_seen_at)
    reliable    fetching without losing: a per-worker processing list, a heartbeat, recovery
    errors      which failures are worth retrying
    backoff     how long to wait before the next attempt
    delayed     waiting without blocking: retries parked in a sorted set until due
    dlq         what a dead letter records, and turning one back into a message
    worker      the loop that ties them together, and a graceful stop
    replay      moving dead letters back, by hand, once
    monitor     queue depths and the age of the oldest work, for alerts and dashboards

The learner-facing scripts (worker.py, replay.py, alert.py, status.py) are thin entry points.
Modules import each other relatively, so the package works both from the submission directory
(`import retryqueue`) and installed inside the harness (`retrylab.solution.backoff_dlq.retryqueue`).
"""
