"""Advanced: messages queued behind a failing one are not held up while it waits for its retry."""
import pytest

from retrylab import runreport
from retrylab.checks.backoff_dlq import advanced, observe
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.advanced("non-blocking")


def test_good_messages_are_not_held_up_by_a_retry_wait(advanced_run, request):
    run = advanced_run.run
    runreport.attach_runs(request.node, run)
    observe.require_script(run, "worker.py")
    goods = advanced_run.goods
    delays = advanced.blocked_goods(run.calls, goods)
    if len(delays) < len(goods):
        fail(tr("advanced_msg.non-blocking.never_processed", missing=len(goods) - len(delays), total=len(goods),
                how=runreport.how_it_ran(run)))
    good, delay = max(delays, key=lambda pair: pair[1])
    if delay > advanced.BLOCKED:
        failing = ", ".join(advanced.TRANSIENT + (advanced.FLAKY,))
        fail(tr("advanced_msg.non-blocking.held_up", failing=failing, delay=delay))
