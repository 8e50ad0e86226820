"""Step 5: flaky-1 notified 2 times, flaky-2 3 times, neither dead-lettered (what is checked, and why: the module it calls)."""
import pytest

from retrylab import runreport
from retrylab.checks.retry_topics import success_stops

pytestmark = pytest.mark.step(5)


def test_a_successful_retry_ends_the_retries(main_run, request):
    runreport.attach_runs(request.node, main_run.main, main_run.retry)
    success_stops.verify(main_run)
