"""Step 4: retry_consumer.py retries no earlier than nextRetryTime, attempts an interval apart (what is checked, and why: the module it calls)."""
import pytest

from retrylab import runreport
from retrylab.checks.retry_topics import wait

pytestmark = pytest.mark.step(4)


def test_retries_wait_until_next_retry_time(main_run, request):
    runreport.attach_runs(request.node, main_run.main, main_run.retry)
    wait.verify(main_run)
