"""Step 8: replay.py moves the DLQ entry back to q:tasks with attempts 0, once, and exits."""
import json

import pytest

from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.settling import ONE_SHOT
from retrylab.checks.backoff_dlq.messages import attempts_of, decode_json, original_fields, same_original, shorten, tr
from retrylab.fixtures import messages
from retrylab.verdict import fail

pytestmark = pytest.mark.step(8)


def _dlq_entry(worker_run) -> tuple[bytes, str]:
    """The learner's own DLQ entry when their worker produced a usable one, else a lab-format one."""
    bad = worker_run.bad
    for raw in observe.dlq_entries(worker_run.dlq):
        value, problem = decode_json(raw)
        if not problem and not same_original(value, bad):
            return raw, ""
    entry = messages.lab_dlq_entry(bad, error=f"task {bad['id']}: kind=bad is rejected by taskproc")
    return entry.encode(), tr("step8.seeded_entry", entry=shorten(entry, 200))


def test_replay_moves_the_entry_back_once_and_exits(worker_run, learner, redis_backend, step, request):
    raw, note = _dlq_entry(worker_run)
    prefix = f"{note}\n" if note else ""
    with redis_backend.private() as endpoint, endpoint.client() as client:
        client.rpush(messages.DLQ, raw)
        run = learner.run("replay.py", endpoint, timeout=step.timeout, stop_when=ONE_SHOT)
        queue = client.lrange(messages.QUEUE, 0, 10) if client.type(messages.QUEUE) == b"list" else None
        queue_type = client.type(messages.QUEUE).decode()
        dlq_left = client.llen(messages.DLQ) if client.type(messages.DLQ) == b"list" else client.exists(messages.DLQ)
    observe.attach(request.node, run)
    if note:
        request.node.user_properties.append(("retrylab_output", note))
    observe.require_script(run, "replay.py")
    result = run.result
    if result.stopped:
        fail(prefix + tr("step8.still_running", how=result.describe()))
    if result.returncode != 0:
        fail(f"{prefix}{observe.how_it_ran(run)}")
    if dlq_left:
        fail(prefix + tr("step8.dlq_left", dlq=messages.DLQ, count=dlq_left))
    if queue_type not in ("list", "none"):
        fail(prefix + tr("step8.queue_type", queue=messages.QUEUE, type=queue_type))
    if not queue or len(queue) != 1:
        fail(prefix + tr("step8.queue_length", queue=messages.QUEUE, count=len(queue or [])))
    value, problem = decode_json(queue[0])
    if problem:
        fail(prefix + tr("step8.not_json", problem=problem, raw=shorten(queue[0].decode("utf-8", "replace"))))
    difference = same_original(value, worker_run.bad)
    if difference:
        fail(prefix + tr("step8.payload", difference=difference))
    # the count lives at the top level (plain message or envelope); an envelope without one may
    # still carry the old count inside its payload, which a worker would then read
    holder = value if "attempts" in value else (original_fields(value) or {})
    if "attempts" in holder and attempts_of(holder) != 0:
        fail(prefix + tr("step8.attempts", attempts=shorten(json.dumps(holder["attempts"]))))
