"""Advanced: a burst of failures does not grow the consumers' threads (run_durable.py's second batch: FAILURES
failing callbacks at once, each first retry hanging where it is made)."""
import pytest

from retrylab.checks.retry_topics import durability, lab, observe, waiting
from retrylab.checks.retry_topics.catalog import tr
from retrylab.checks.retry_topics.run_durable import FAILURES
from retrylab.verdict import fail

pytestmark = pytest.mark.advanced("bounded-concurrency")

GROWTH_LIMIT = 4    # threads more than before the burst (which the reference keeps at 0)
BLOCKED_LIMIT = 4   # notify calls of one script blocked at once (each in a hung retry): a fixed pool of workers, one
# per partition say, stays under it; the reference has one
# A thread per failure may get neither far: past the sandbox's limit of processes (threads count), Python raises
# this where the learner starts the next one (its timers keep the process alive)
NO_MORE_THREADS = "can't start new thread"


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
        script_run = run.first.runs[script]
        if NO_MORE_THREADS in script_run.result.stderr:
            fail(tr("advanced_msg.bounded-concurrency.no_more_threads", script=script, burst=FAILURES,
                    error=NO_MORE_THREADS))
        blocked = sum(1 for calls in durability.attempts(run).values() for a in calls
                      if a.outcome == "hung" and a.script == script and not a.after_kill)
        if blocked >= BLOCKED_LIMIT:
            fail(tr("advanced_msg.bounded-concurrency.blocked", script=script, burst=FAILURES, count=blocked))
        before, peak = growth
        if peak - before >= GROWTH_LIMIT:
            fail(tr("advanced_msg.bounded-concurrency.grew", script=script, burst=FAILURES, before=before, peak=peak))
