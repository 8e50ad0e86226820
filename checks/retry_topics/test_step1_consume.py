"""Step 1: consumer.py notifies every ok callback exactly once and commits its offsets to the ends."""
import pytest

from retrylab import runreport
from retrylab.checks.retry_topics import consume

pytestmark = pytest.mark.step(1)


def test_every_ok_callback_notified_once_and_committed(main_run, request):
    runreport.attach_runs(request.node, main_run.main, main_run.retry)
    consume.verify(main_run)
