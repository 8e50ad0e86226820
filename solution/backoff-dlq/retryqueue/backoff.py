"""Retry wait strategies, built from small pieces that wrap each other.

A strategy is a function `attempt -> seconds`, attempt 0 being the first retry. The worker's
whole policy reads as one line,

    full_jitter(capped(exponential(1.0), 30.0))

and each piece can be printed and checked on its own (make_outputs.py writes the lab's files
from these very functions).
"""
import random


def exponential(base):
    # Doubling the wait each time gives a struggling service room to recover,
    # instead of hitting it again at a fixed interval.
    return lambda attempt: base * 2 ** attempt


def capped(strategy, cap):
    # Exponentials grow fast: without a cap, attempt 10 waits 17 minutes.
    return lambda attempt: min(cap, strategy(attempt))


def full_jitter(strategy, rng=random):
    # Anywhere in [0, wait]: many clients that failed at the same moment do not
    # all retry at the same moment too (a thundering herd). `rng` is injectable
    # so that tests can use a seeded random.Random.
    return lambda attempt: rng.uniform(0, strategy(attempt))


def policy(base=1.0, cap=30.0):
    """The worker's policy: capped exponential backoff with full jitter."""
    return full_jitter(capped(exponential(base), cap))
