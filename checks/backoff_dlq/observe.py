"""Reading what the learner's scripts did, in the lab's terms, with messages a learner can act on."""
from __future__ import annotations

import json
from pathlib import Path

from retrylab.checks.backoff_dlq.messages import attempts_of, decode_json, message_id, shorten
from retrylab.fixtures import messages
from retrylab.plugin import attach_output
from retrylab.runner import ScriptRun
from retrylab.verdict import fail, indent

ARTIFACT_LIMIT = 16 << 20
# Commands that write a value into Redis: where a requeued message can be seen on its way back.
_WRITES = {"LPUSH", "RPUSH", "LPUSHX", "RPUSHX", "LSET", "LINSERT", "ZADD", "SET", "SETEX", "PSETEX",
           "SETNX", "MSET", "HSET", "HSETNX", "HMSET", "SADD", "XADD", "EVAL", "EVALSHA", "FCALL"}


def attach(node, run: ScriptRun) -> None:
    if run.result is not None:
        attach_output(node, (run.result.stdout + run.result.stderr).strip())


def how_it_ran(run: ScriptRun) -> str:
    """One or more lines about how the script ended, with the end of its stderr if it crashed."""
    result = run.result
    text = result.describe()
    if (result.crashed or result.stopped == "timeout") and result.stderr_tail():
        text += ":\n" + indent(result.stderr_tail())
    return text


def require_script(run: ScriptRun, script: str) -> None:
    if run.missing:
        fail(f"{script} is missing from your submission: this step runs it.")


def read_artifact(submission: Path, name: str) -> bytes | None:
    path = submission / name
    if path.is_symlink():
        fail(f"{name} is a symbolic link; put the file itself in your submission.")
    if not path.exists():
        return None
    if not path.is_file():
        fail(f"{name} is not a regular file.")
    with path.open("rb") as f:
        data = f.read(ARTIFACT_LIMIT + 1)
    if len(data) > ARTIFACT_LIMIT:
        fail(f"{name} is larger than {ARTIFACT_LIMIT >> 20} MB; it should be a few short lines.")
    return data


def call_fields_problem(arg: str, seeded: dict) -> str:
    """Why the argument process received is not the seeded message ("" when it is)."""
    try:
        value = json.loads(arg)
    except ValueError:
        return f"process received {shorten(arg)} - not the decoded message"
    if not isinstance(value, dict):
        return f"process received a {type(value).__name__}, not the decoded message (a dict): use json.loads"
    original = messages.original(seeded)
    for key, expected in original.items():
        if value.get(key) != expected:
            return (f"process received {shorten(arg)}; its {key!r} should be {shorten(json.dumps(expected))} "
                    f"- pass the original message's fields (an envelope's payload, not the envelope)")
    return ""


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
            value, problem = decode_json(arg)
            if not problem and isinstance(value, (dict, str)):
                found.append((command.name, key, value))
    return found


def requeue_counts(run: ScriptRun, message_id_: str) -> list[int | None]:
    """The attempt counts carried by each write of the message back into Redis (DLQ excluded),
    with consecutive repeats folded (a message written to a retry set, then to the queue, is one
    requeue)."""
    counts: list[int | None] = []
    for _, _, value in written_values(run, exclude_key=messages.DLQ):
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
