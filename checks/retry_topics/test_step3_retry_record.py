"""Step 3: a failed callback goes to callbacks.retry with retryTimes 1 and its nextRetryTime (what is checked, and why: the module it calls)."""
import pytest

from retrylab import runreport
from retrylab.checks.retry_topics import retry_record

pytestmark = pytest.mark.step(3)


def test_a_failed_callback_goes_to_the_retry_topic(main_run, request):
    runreport.attach_runs(request.node, main_run.main, main_run.retry)
    retry_record.verify(main_run)
