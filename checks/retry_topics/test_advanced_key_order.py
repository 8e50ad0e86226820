"""Advanced key-order (reported): a retried callback does not reorder later callbacks of its key."""
import pytest

from retrylab import runreport
from retrylab.checks.retry_topics import key_order

pytestmark = pytest.mark.advanced("key-order")


def test_retry_keeps_the_order_of_a_key(main_run, request):
    runreport.attach_runs(request.node, main_run.main, main_run.retry)
    key_order.verify(main_run)
