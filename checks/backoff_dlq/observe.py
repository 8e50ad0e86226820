"""Reading what the learner's scripts did, in the lab's terms, with messages a learner can act on."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from retrylab.appchannel import describe_call_limit, describe_malformed
from retrylab.calllog import MALFORMED, Call

from retrylab.checks.backoff_dlq.stored_values import (attempts_of, decode_json, may_hold_object_or_string, message_id,
                                                       shorten)
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.checks.backoff_dlq import lab
from retrylab.fixtures.backoff_dlq import message_factory
from retrylab.runner import ScriptRun
from retrylab.verdict import fail

ARTIFACT_LIMIT = 16 << 20
# Commands that write a value into Redis: where a requeued message can be seen on its way back.
_WRITES = {"LPUSH", "RPUSH", "LPUSHX", "RPUSHX", "LSET", "LINSERT", "ZADD", "SET", "SETEX", "PSETEX",
           "SETNX", "MSET", "HSET", "HSETNX", "HMSET", "SADD", "XADD", "EVAL", "EVALSHA", "FCALL"}


def require_script(run: ScriptRun, script: str) -> None:
    if run.missing:
        fail(tr("observe.script_missing", script=script))


def read_artifact(submission: Path, name: str) -> bytes | None:
    path = submission / name
    if path.is_symlink():
        fail(tr("observe.symlink", name=name))
    if not path.exists():
        return None
    if not path.is_file():
        fail(tr("observe.not_regular", name=name))
    with path.open("rb") as f:
        data = f.read(ARTIFACT_LIMIT + 1)
    if len(data) > ARTIFACT_LIMIT:
        fail(tr("observe.too_large", name=name, megabytes=ARTIFACT_LIMIT >> 20))
    return data


def call_fields_problem(arg: str, seeded: dict) -> str:
    """Why the argument process received is not the seeded message ("" when it is)."""
    try:
        value = json.loads(arg)
    except ValueError:
        return tr("observe.not_decoded", arg=shorten(arg))
    if not isinstance(value, dict):
        return tr("observe.not_dict", type=type(value).__name__)
    original = message_factory.original(seeded)
    for key, expected in original.items():
        if value.get(key) != expected:
            return tr("observe.wrong_field", arg=shorten(arg), key=repr(key), expected=shorten(json.dumps(expected)))
    return ""


def require_honest_calls(run: ScriptRun, seeded: Iterable[dict]) -> None:
    """Fail unless every call the harness recorded was a readable call of process, within the run's
    limit of calls, with each queued message's fields as they were queued. The outcome of a queued
    message follows the kind it was queued with, so a worker that changes it (kind bad -> good)
    still sees process fail; this names what it changed."""
    problem = dishonest_calls(run, seeded)
    if problem:
        fail(problem)


def dishonest_calls(run: ScriptRun, seeded: Iterable[dict]) -> str:
    """What `require_honest_calls` fails on, or ""."""
    if run.call_limit is not None:
        return describe_call_limit(run.result.script, run.call_limit)
    queued = {m["id"]: m for m in seeded}
    for call in run.calls:
        if call.outcome == MALFORMED:
            return tr("observe.malformed", problem=describe_malformed(call))
        if call.altered is not None and call.id in queued:
            return _altered(call, queued[call.id])
    return ""


def _altered(call: Call, message: dict) -> str:
    key = call.altered
    queued = shorten(repr(message.get(key)))
    received = _received_fields(call.arg, message["id"])
    if received is None or key not in received:
        return tr("observe.altered_missing", id=message["id"], key=key, queued=queued)
    return tr("observe.altered", id=message["id"], key=key, got=shorten(repr(received[key])), queued=queued)


def _received_fields(arg: str, id_: str) -> dict | None:
    """The fields of the message process received (the argument, or its envelope's payload)."""
    try:
        value = json.loads(arg)
    except ValueError:
        return None
    if isinstance(value, dict) and value.get("id") != id_ and isinstance(value.get("payload"), dict):
        value = value["payload"]
    return value if isinstance(value, dict) else None


def written_values(run: ScriptRun, *, exclude_key: str) -> list[tuple[str, str, object]]:
    """(command, key, decoded JSON value) for every value the script wrote, except to `exclude_key`."""
    found = []
    for command in run.commands:
        if command.name not in _WRITES or len(command.args) < 2:
            continue
        key = command.args[1].decode("utf-8", "replace")
        if key == exclude_key:
            continue
        for arg in command.args[2:]:
            if not may_hold_object_or_string(arg):
                continue
            value, problem = decode_json(arg)
            if not problem and isinstance(value, (dict, str)):
                found.append((command.name, key, value))
    return found


def requeue_counts(run: ScriptRun, message_id_: str) -> list[int | None]:
    """The attempt counts carried by each write of the message back into Redis (DLQ excluded),
    with consecutive repeats folded (a message written to a retry set, then to the queue, is one
    requeue)."""
    counts: list[int | None] = []
    for _, _, value in written_values(run, exclude_key=lab.DLQ):
        if message_id(value) != message_id_:
            continue
        count = attempts_of(value)
        if not counts or counts[-1] != count:
            counts.append(count)
    while counts and counts[0] == 0:  # the message as seeded, e.g. moved to a processing list
        counts.pop(0)
    return counts


def dlq_entries(content) -> list[bytes]:
    return list(content.values) if content is not None else []
