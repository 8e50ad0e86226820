"""Step 2: consumer.py never waits for a retry (what is checked, and why: the module it calls)."""
import pytest

from retrylab import runreport
from retrylab.checks.retry_topics import nonblocking

pytestmark = pytest.mark.step(2)


def test_callbacks_behind_a_failure_are_not_held_up(main_run, request):
    runreport.attach_runs(request.node, main_run.main, main_run.retry)
    nonblocking.verify(main_run)
