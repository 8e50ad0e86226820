"""`retrylab verify --exercise stream-consumer`: read-only checks of a learner's live Redis (steps 1, 3, 5)."""
from __future__ import annotations


def step_verifiers() -> dict:
    """Step number -> verifier(live_broker) -> list of problems; filled in by the verify work."""
    return {}
