"""Step 5: capped.txt holds the backoff for attempts 0..8 with a 30 s cap."""
import pytest

from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.artifacts import parse_capped
from retrylab.verdict import fail

pytestmark = pytest.mark.step(5)


def test_backoff_is_capped_at_30(submission):
    result = parse_capped(observe.read_artifact(submission, "capped.txt"))
    if not result.ok:
        fail(result.problem)
