"""Step 4: jitter.txt holds 20 full-jitter waits for attempt 3."""
import pytest

from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.artifacts import parse_jitter
from retrylab.verdict import fail

pytestmark = pytest.mark.step(4)


def test_jitter_is_spread_over_0_to_8(submission):
    result = parse_jitter(observe.read_artifact(submission, "jitter.txt"))
    if not result.ok:
        fail(result.problem)
