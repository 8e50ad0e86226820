"""Step 3: schedule.txt holds the exponential backoff schedule for attempts 0..5."""
import pytest

from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.artifacts import parse_schedule
from retrylab.plugin import attach_location
from retrylab.verdict import fail

pytestmark = pytest.mark.step(3)


def test_schedule_is_base_times_two_to_the_attempt(submission, request):
    result = parse_schedule(observe.read_artifact(submission, "schedule.txt"))
    if not result.ok:
        attach_location(request.node, "schedule.txt", result.line)
        fail(result.problem)
