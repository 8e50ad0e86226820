"""Retry wait strategies, built from three tiny pieces.

A strategy is a function `attempt -> seconds` (attempt 0 is the first retry).
The pieces wrap each other, so the worker's whole policy reads as one line:

    full_jitter(capped(exponential(1.0), 30.0))

and each piece can be printed and checked on its own (see make_outputs.py).
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
    # Pick anywhere in [0, wait] so that many clients failing at the same
    # moment do not all retry at the same moment too (a thundering herd).
    # `rng` is injectable so tests can use a seeded random.Random.
    return lambda attempt: rng.uniform(0, strategy(attempt))
