"""Step 6: down notified 3 times, then one record on callbacks.dlq with the error (what is checked, and why: the module it calls)."""
import pytest

from retrylab import runreport
from retrylab.checks.retry_topics import dead_letter

pytestmark = pytest.mark.step(6)


def test_three_failures_end_in_one_dlq_record_with_the_error(main_run, request):
    runreport.attach_runs(request.node, main_run.main, main_run.retry)
    dead_letter.verify(main_run)
