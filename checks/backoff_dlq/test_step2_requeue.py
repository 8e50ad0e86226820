"""Step 2: a failed message goes back on q:tasks with its attempt count + 1."""
import pytest

from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.artifacts import requeue_out_shows_attempts
from retrylab.verdict import fail

pytestmark = pytest.mark.step(2)


def test_requeue_out_shows_attempts_2(submission):
    result = requeue_out_shows_attempts(observe.read_artifact(submission, "requeue.out"), 2)
    if not result.ok:
        fail(result.problem)


def test_each_requeue_adds_one_attempt(worker_run, request):
    run = worker_run.run
    observe.attach(request.node, run)
    observe.require_script(run, "worker.py")
    bad = worker_run.bad
    counts = observe.requeue_counts(run, bad["id"])
    if not counts:
        calls = len(worker_run.calls_for(bad))
        fail(f"the failing message (seeded with attempts 0) was never written back to Redis after process "
             f"raised ({calls} call(s) of process for it). {observe.how_it_ran(run)}")
    if None in counts:
        fail("the requeued message carries no integer `attempts` (at its top level, or an envelope's); "
             f"attempt counts seen on requeue: {counts}")
    expected = list(range(1, len(counts) + 1))
    if counts != expected:
        fail(f"each failure must add exactly 1 to the message's attempts: after 1, 2, 3 ... failures the "
             f"requeued message should carry attempts {expected}, but it carried {counts}.")
