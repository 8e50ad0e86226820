"""Advanced: the worker really waits between attempts, with capped exponential backoff and jitter.

Observed on the virtual clock in the run of steps 1, 2, 6 and 7, where the failing message is the
only one that waits (see advanced.py for how waiting is told from processing and real time).
"""
import pytest

from retrylab import runreport
from retrylab.checks.backoff_dlq import advanced, observe
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.advanced("backoff-applied")


def test_waits_between_attempts_follow_capped_exponential_backoff(worker_run, request):
    run = worker_run.run
    runreport.attach_runs(request.node, run)
    observe.require_script(run, "worker.py")
    attempts = len(worker_run.calls_for(worker_run.bad))
    if attempts < 2:
        fail(tr("advanced_msg.backoff-applied.too_few_calls", attempts=attempts, how=runreport.how_it_ran(run)))
    waits = advanced.retry_waits(run.calls, worker_run.bad["id"])
    problem = advanced.backoff_problem(waits)
    if problem:
        fail(tr("advanced_msg.backoff-applied.waits", problem=problem, last=len(waits) + 1,
                waits=advanced.describe_waits(waits)))
