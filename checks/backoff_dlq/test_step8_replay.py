"""Step 8: replay.py moves the DLQ entry back to q:tasks with attempts 0, once, and exits; and the
learner's own worker, run on what replay.py pushed, hands process the original message.

The last part checks replay end to end: an envelope with a `payload` is a legitimate form, but a
worker that reads flat messages would "process" the whole DLQ record and never retry the original.
When the learner's worker did not process messages in the lab steps' run (missing, crashing, never
calling process), it cannot judge the replay: the form alone is checked then, and the step says so."""
import json

import pytest

from retrylab import runreport
from retrylab.checks.backoff_dlq import lab, observe
from retrylab.checks.backoff_dlq.settling import ONE_SHOT, worker_settled
from retrylab.checks.backoff_dlq.stored_values import decode_json, same_original, shorten
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.fixtures.backoff_dlq import message_factory
from retrylab.fixtures.backoff_dlq.taskproc_app import TaskprocApp
from retrylab.plugin import attach_output
from retrylab.verdict import fail

pytestmark = pytest.mark.step(8)
WORKER_TIMEOUT = 5.0   # real seconds: the outer bound of the learner's worker run on the replayed message


def _dlq_entry(worker_run) -> tuple[bytes, str]:
    """The learner's own DLQ entry when their worker produced a usable one, else a lab-format one."""
    bad = worker_run.bad
    for raw in observe.dlq_entries(worker_run.dlq):
        value, problem = decode_json(raw)
        if not problem and not same_original(value, bad):
            return raw, ""
    entry = message_factory.lab_dlq_entry(bad, error=f"task {bad['id']}: kind=bad is rejected by taskproc")
    return entry.encode(), tr("step8.seeded_entry", entry=shorten(entry, 200))


def _worker_unusable(worker_run) -> str:
    """Why the learner's worker cannot judge the replayed message ("" when it can): it did not
    process any of the queued messages successfully in the lab steps' run, or that run was not an honest one (a
    flood of calls, malformed requests, queued messages changed before process saw them)."""
    run = worker_run.run
    if run.result is None:
        return tr("step8.worker_missing")
    queued = {m["id"] for m in worker_run.seeded}
    if not any(call.outcome == "ok" and call.id in queued for call in run.calls):
        return tr("step8.worker_unusable", how=runreport.how_it_ran(run))
    problem = observe.dishonest_calls(run, worker_run.seeded)   # steps 1, 6 and 7 fail for this already
    if problem:
        return tr("step8.worker_dishonest", problem=problem)
    return ""


def _called_process(progress) -> bool:
    """The worker's work on the replayed message, for stopping it: it handed process something (the
    original, or not: the check tells which); it is stopped once it settles after that."""
    return bool(progress.calls())


def _check_with_the_learners_worker(worker_run, learner, redis_backend, replayed: bytes, prefix: str) -> None:
    """Run the learner's worker on the replayed message alone: process must receive the original."""
    bad = worker_run.bad
    with redis_backend.private() as endpoint, endpoint.client() as client:
        client.rpush(lab.QUEUE, replayed)
        run = learner.run("worker.py", endpoint, timeout=WORKER_TIMEOUT, stop_when=worker_settled(_called_process),
                          app=TaskprocApp(seeded=[bad]))
    if any(not observe.call_fields_problem(call.arg, bad) for call in run.calls):
        return
    if not run.calls:
        fail(prefix + tr("step8.worker_no_call", queue=lab.QUEUE, how=runreport.how_it_ran(run)))
    first = run.calls[0]
    fail(prefix + tr("step8.worker_wrong_message", queue=lab.QUEUE,
                     problem=observe.call_fields_problem(first.arg, bad)))


def test_replay_moves_the_entry_back_once_and_exits(worker_run, learner, redis_backend, step, request):
    raw, note = _dlq_entry(worker_run)
    unusable = _worker_unusable(worker_run)
    if unusable:   # today's check of the form alone, and the step says so
        note = "\n".join(filter(None, (note, tr("step8.form_only", why=unusable))))
    prefix = f"{note}\n" if note else ""
    with redis_backend.private() as endpoint, endpoint.client() as client:
        client.rpush(lab.DLQ, raw)
        run = learner.run("replay.py", endpoint, timeout=step.timeout, stop_when=ONE_SHOT)
        queue = client.lrange(lab.QUEUE, 0, 10) if client.type(lab.QUEUE) == b"list" else None
        queue_type = client.type(lab.QUEUE).decode()
        dlq_left = client.llen(lab.DLQ) if client.type(lab.DLQ) == b"list" else client.exists(lab.DLQ)
    runreport.attach_runs(request.node, run)
    if note:
        attach_output(request.node, note)
    observe.require_script(run, "replay.py")
    result = run.result
    if result.stopped:
        fail(prefix + tr("step8.still_running", how=result.describe()))
    if result.returncode != 0:
        fail(f"{prefix}{runreport.how_it_ran(run)}")
    if dlq_left:
        fail(prefix + tr("step8.dlq_left", dlq=lab.DLQ, count=dlq_left))
    if queue_type not in ("list", "none"):
        fail(prefix + tr("step8.queue_type", queue=lab.QUEUE, type=queue_type))
    if not queue or len(queue) != 1:
        fail(prefix + tr("step8.queue_length", queue=lab.QUEUE, count=len(queue or [])))
    value, problem = decode_json(queue[0])
    if problem:
        fail(prefix + tr("step8.not_json", problem=problem, raw=shorten(queue[0].decode("utf-8", "replace"))))
    difference = same_original(value, worker_run.bad)
    if difference:
        fail(prefix + tr("step8.payload", difference=difference))
    if lab.count_not_reset(value):
        fail(prefix + tr("step8.attempts", attempts=shorten(json.dumps(lab.counted_fields(value)["attempts"]))))
    if not unusable:
        _check_with_the_learners_worker(worker_run, learner, redis_backend, queue[0], prefix)
