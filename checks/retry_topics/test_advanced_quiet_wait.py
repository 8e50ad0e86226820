"""Advanced: retry_consumer.py waits for a retry's nextRetryTime without spinning (run_durable.py's first
half: from the target's retry record to its retry). On the virtual clock a sleep, or a poll with a timeout,
moves the clock for next to no CPU; a loop that keeps checking the time moves it only as fast as real time,
burning a CPU all along."""
import pytest

from retrylab.checks.retry_topics import lab, waiting
from retrylab.checks.retry_topics.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.advanced("quiet-wait")

def test_the_retry_consumer_waits_without_spinning(durable_run):
    run = durable_run
    if run.missing:
        fail(tr("observe.script_missing", script=run.missing))
    wait = waiting.waiting(run)
    if wait is None:
        fail(tr("advanced_msg.quiet-wait.not_tried", topic=lab.RETRY_TOPIC))
    if wait.spins:
        fail(tr("advanced_msg.quiet-wait.spins", script=lab.RETRY_SCRIPT, cpu=f"{wait.cpu:.2f}",
                real=f"{wait.real:.1f}", virtual=f"{wait.virtual:.1f}"))
