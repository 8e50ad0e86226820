"""Advanced: a burst of failures does not grow the consumers' threads (run_durable.py's second batch: FAILURES
failing callbacks at once, each first retry hanging where it is made)."""
import pytest

from retrylab.checks.retry_topics import lab, observe, waiting
from retrylab.checks.retry_topics.catalog import tr
from retrylab.checks.retry_topics.run_durable import FAILURES
from retrylab.verdict import fail

pytestmark = pytest.mark.advanced("bounded-concurrency")

GROWTH_LIMIT = 4    # threads more than before the burst (which the reference keeps at 0): a thread per failure
# gets there long before its process runs out of address space for more (at about 20 threads under the sandbox's
# 1 GiB: each new thread's malloc arena takes 64 MB), which ends it during the burst (also a failure here)


def test_a_burst_of_failures_does_not_grow_the_threads(durable_run):
    run = durable_run
    if run.missing:
        fail(tr("observe.script_missing", script=run.missing))
    for script in (lab.MAIN_SCRIPT, lab.RETRY_SCRIPT):
        growth = waiting.thread_growth(run, script)
        if growth is None:
            fail(tr("advanced_msg.bounded-concurrency.not_tried", burst=FAILURES))
        ended = waiting.ended_in_burst(run, script)
        if ended is not None:
            fail(tr("advanced_msg.bounded-concurrency.ended", script=script, burst=FAILURES,
                    how=observe.how_it_ran(ended)))
        before, peak = growth
        if peak - before >= GROWTH_LIMIT:
            fail(tr("advanced_msg.bounded-concurrency.grew", script=script, burst=FAILURES, before=before, peak=peak))
