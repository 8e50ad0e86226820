"""Step 2: a failed message goes back on q:tasks with its attempt count + 1."""
import pytest

from retrylab import runreport
from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.artifacts import requeue_out_shows_attempts
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.plugin import attach_location
from retrylab.verdict import fail

pytestmark = pytest.mark.step(2)


def test_requeue_out_shows_attempts_2(submission, request):
    result = requeue_out_shows_attempts(observe.read_artifact(submission, "requeue.out"), 2)
    if not result.ok:
        attach_location(request.node, "requeue.out", result.line)
        fail(result.problem)


def test_each_requeue_adds_one_attempt(worker_run, request):
    run = worker_run.run
    runreport.attach_runs(request.node, run)
    observe.require_script(run, "worker.py")
    bad = worker_run.bad
    counts = observe.requeue_counts(run, bad["id"])
    if not counts:
        calls = len(worker_run.calls_for(bad))
        fail(tr("step2.never_requeued", calls=calls, how=runreport.how_it_ran(run)))
    if None in counts:
        fail(tr("step2.no_count", counts=counts))
    expected = list(range(1, len(counts) + 1))
    if counts != expected:
        fail(tr("step2.not_plus_one", expected=expected, counts=counts))
