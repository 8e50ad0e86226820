"""`retrylab verify --exercise jetstream-dlq`: read-only checks of a learner's live NATS (steps 1, 2, 5, 7)."""
from __future__ import annotations


def step_verifiers() -> dict:
    """Step number -> verifier; written by the verify work."""
    return {}
