"""backoff-dlq's `retrylab verify` step verifiers: is step N done in a live lab environment?

Read-only facts per step from the learner's files and own Redis, established with the very parsers,
readers and rules the checks use (artifacts.py, stored_values.py, observe.read_artifact, lab.py), so
steps 3-5 get the same verdict from `verify` as from `check`. What only running the learner's code
can show, each step names (`StepVerifier.unchecked`). The engine's driver (retrylab.verify) loads
this module by the name exercise.toml gives (`verifiers`).
"""
from __future__ import annotations

import json
import re
from typing import Callable

from retrylab.brokers.redis.live import LIST_READ, ListState, LiveRedis
from retrylab.checks.backoff_dlq import lab, observe
from retrylab.checks.backoff_dlq.artifacts import (parse_capped, parse_jitter, parse_schedule,
                                                   requeue_out_shows_attempts)
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.checks.backoff_dlq.lab import DLQ, QUEUE
from retrylab.checks.backoff_dlq.stored_values import (attempts_of, decode_json, original_fields,
                                                       parse_timestamp, shorten)
from retrylab.verdict import CheckFailed
from retrylab.verify import FAIL, OK, Fact, Live, StepVerifier


def live_broker(url: str) -> LiveRedis:
    """The learner's own Redis at `url`, read-only; connected on first use, so file-only steps never touch it."""
    return LiveRedis(url)


_UNUSABLE = object()   # read(): the file is there but cannot be read as the checks read it


def read(live: Live, name: str):
    """The file's bytes as the checks read them, None if it is missing, or `_UNUSABLE` (with a
    fact saying why: a symbolic link, a directory, too large)."""
    try:
        return observe.read_artifact(live.directory, name)
    except CheckFailed as exc:
        live.facts.fail(exc.message)
        return _UNUSABLE


def script(live: Live, name: str) -> str | None:
    """The script's text if it exists and compiles (compile() writes no bytecode anywhere)."""
    data = read(live, name)
    if data is _UNUSABLE:
        return None
    if data is None:
        live.facts.fail(tr("verify.missing", name=name, directory=str(live.directory)))
        return None
    live.facts.ok(tr("verify.exists", name=name))
    try:
        compile(data, name, "exec", dont_inherit=True)
    except SyntaxError as exc:  # Python's own words for the error (exc.msg) stay as Python says them
        if exc.lineno:
            live.facts.fail(tr("verify.does_not_compile_line", name=name, error=exc.msg, line=exc.lineno))
        else:
            live.facts.fail(tr("verify.does_not_compile", name=name, error=exc.msg))
        return None
    except Exception as exc:  # noqa: BLE001 - NUL bytes, nesting too deep: still the learner's file
        error = shorten(str(exc) or type(exc).__name__, 120)
        live.facts.fail(tr("verify.does_not_compile", name=name, error=error))
        return None
    live.facts.ok(tr("verify.compiles", name=name))
    return data.decode("utf-8", "replace")


def parsed_file(name: str, parser, passed: str) -> Callable[[Live], None]:
    """The file's verdict by the check's own parser; `passed`: the catalog key of the fact when it passes."""
    def run(live: Live) -> None:
        data = read(live, name)
        if data is _UNUSABLE:
            return
        result = parser(data)
        if result.ok:
            live.facts.ok(tr(passed, name=name))
        else:
            live.facts.fail(result.problem)
    return run


def a_list(live: Live, key: str) -> ListState | None:
    state = live.broker.list_state(key)
    if state.type not in ("list", "none"):
        live.facts.fail(tr("verify.not_a_list", key=key, type=state.type))
        return None
    return state


def worker(live: Live) -> None:
    source = script(live, "worker.py")
    if source is None:
        return
    if QUEUE in source:
        live.facts.ok(tr("verify.mentions", name=QUEUE))
    else:
        live.facts.fail(tr("verify.never_mentions_queue", queue=QUEUE))
    if re.search(r"\bprocess\b", source):
        live.facts.ok(tr("verify.mentions", name="process"))
    else:
        live.facts.fail(tr("verify.never_mentions_process"))


def requeue(live: Live) -> None:
    data = read(live, "requeue.out")
    if data is _UNUSABLE:
        return
    result = requeue_out_shows_attempts(data, 2)
    if not result.ok:
        live.facts.fail(result.problem)
        return
    live.facts.ok(tr("verify.requeue_ok"))
    for key in (QUEUE, DLQ):
        state = a_list(live, key)
        if state is None:
            continue
        if not state.length:
            live.facts.note(tr("verify.nothing_to_count", key=key))
            continue
        counted = 0
        for raw in state.items:
            value, problem = decode_json(raw)
            if problem or not isinstance(value, dict) or "attempts" not in value:
                continue
            if attempts_of(value) is None:
                live.facts.fail(tr("verify.attempts_not_integer", key=key,
                                   value=shorten(json.dumps(value["attempts"]), 40)))
                return
            counted += 1
        seen = min(state.length, LIST_READ)
        text = tr("verify.counted" if counted == seen else "verify.counted_some", counted=counted, seen=seen,
                  key=key)
        (live.facts.ok if counted else live.facts.note)(text)


def dlq(live: Live) -> None:
    queue, dead = a_list(live, QUEUE), a_list(live, DLQ)
    if queue is not None:
        if queue.length:
            live.facts.fail(tr("verify.queue_not_empty", queue=QUEUE, length=queue.length))
        else:
            live.facts.ok(tr("verify.is_empty", key=QUEUE))
    if dead is not None:
        if dead.length == 1:
            live.facts.ok(tr("verify.dlq_one", dlq=DLQ))
        elif dead.type == "none":
            live.facts.fail(tr("verify.no_dlq", dlq=DLQ))
        else:
            live.facts.fail(tr("verify.dlq_count", dlq=DLQ, length=dead.length))


def entry_facts(raw: bytes) -> list[Fact]:
    """What can be read off one DLQ entry, up to its first problem."""
    found: list[Fact] = []
    text = shorten(raw.decode("utf-8", "replace"), 120)
    entry, problem = decode_json(raw)
    if problem or not isinstance(entry, dict):
        why = problem or tr("verify.not_object")
        return [Fact(FAIL, tr("verify.record.not_json", problem=why, raw=text))]
    found.append(Fact(OK, tr("verify.record.is_object")))
    missing = [k for k in lab.DLQ_FIELDS if k not in entry]
    if missing:
        keys = ", ".join(sorted(map(str, entry))) or tr("verify.no_keys")
        return found + [Fact(FAIL, tr("verify.record.lacks", missing=", ".join(missing), keys=keys))]
    found.append(Fact(OK, tr("verify.record.has_keys")))
    attempts = entry["attempts"]
    if type(attempts) is not int or attempts != lab.MAX_ATTEMPTS:
        return found + [Fact(FAIL, tr("verify.record.attempts", value=shorten(json.dumps(attempts), 40)))]
    found.append(Fact(OK, tr("verify.record.attempts_ok")))
    fields = original_fields(entry)
    if fields is None or fields is entry:
        value = shorten(json.dumps(entry["payload"]), 80)
        return found + [Fact(FAIL, tr("verify.record.payload", value=value))]
    found.append(Fact(OK, tr("verify.record.payload_ok")))
    error = entry["error"]
    if not isinstance(error, str) or not error.strip():
        return found + [Fact(FAIL, tr("verify.record.error", value=shorten(json.dumps(error), 40)))]
    found.append(Fact(OK, tr("verify.record.error_ok")))
    _, problem = parse_timestamp(entry["first_seen_at"])
    if problem:
        value = shorten(json.dumps(entry["first_seen_at"]), 40)
        return found + [Fact(FAIL, tr("verify.record.first_seen", value=value, problem=problem))]
    found.append(Fact(OK, tr("verify.record.first_seen_ok")))
    return found


def dlq_record(live: Live) -> None:
    dead = a_list(live, DLQ)
    if dead is None:
        return
    if not dead.length:
        live.facts.fail(tr("verify.no_entry", dlq=DLQ))
        return
    for index, raw in enumerate(dead.items):
        found = entry_facts(raw)
        failed = any(f.status == FAIL for f in found)
        if failed or index == len(dead.items) - 1:
            label = (tr("verify.entry") if dead.length == 1
                     else tr("verify.entry_of", index=index + 1, count=dead.length))
            for fact in found:
                live.facts.add(Fact(fact.status, tr("verify.entry_fact", entry=label, fact=fact.text)))
            if failed:
                return
    if dead.length > 1:
        live.facts.note(tr("verify.all_entries_checked", dlq=DLQ, length=dead.length))


def replay(live: Live) -> None:
    if script(live, "replay.py") is None:
        return
    queue, dead = a_list(live, QUEUE), a_list(live, DLQ)
    if dead is not None:
        if dead.length:
            live.facts.fail(tr("verify.dlq_not_emptied", dlq=DLQ, length=dead.length))
        else:
            live.facts.ok(tr("verify.is_empty", key=DLQ))
    if queue is None:
        return
    if queue.length != 1:
        live.facts.fail(tr("verify.queue_count", queue=QUEUE, length=queue.length))
        return
    live.facts.ok(tr("verify.queue_one", queue=QUEUE))
    raw = queue.items[0]
    text = shorten(raw.decode("utf-8", "replace"), 120)
    value, problem = decode_json(raw)
    if problem or not isinstance(value, dict):
        live.facts.fail(tr("verify.replayed.not_json", queue=QUEUE, problem=problem or tr("verify.not_object"),
                           raw=text))
        return
    fields = original_fields(value) or (value if "kind" in value else None)
    if fields is None:
        live.facts.fail(tr("verify.replayed.no_payload", queue=QUEUE, raw=text))
        return
    live.facts.ok(tr("verify.replayed.payload", queue=QUEUE))
    counted = lab.counted_fields(value)   # where the check, and a worker, read the count
    if lab.count_not_reset(value):
        count = shorten(json.dumps(counted["attempts"]), 40)
        live.facts.fail(tr("verify.replayed.attempts", queue=QUEUE, value=count))
    else:
        key = "verify.replayed.attempts_ok" if "attempts" in counted else "verify.replayed.no_attempts"
        live.facts.ok(tr(key, queue=QUEUE))


def step_verifiers() -> dict[int, StepVerifier]:
    """The verifier of each lab step, its texts in the current language."""
    return {
        1: StepVerifier(worker, (tr("verify.unchecked.worker_once"), tr("verify.unchecked.worker_survives"))),
        2: StepVerifier(requeue, (tr("verify.unchecked.requeue_plus_one"),)),
        3: StepVerifier(parsed_file("schedule.txt", parse_schedule, "verify.schedule_ok"), ()),
        4: StepVerifier(parsed_file("jitter.txt", parse_jitter, "verify.jitter_ok"), ()),
        5: StepVerifier(parsed_file("capped.txt", parse_capped, "verify.capped_ok"), ()),
        6: StepVerifier(dlq, (tr("verify.unchecked.dlq_five_calls"), tr("verify.unchecked.dlq_goods_once"))),
        7: StepVerifier(dlq_record, (tr("verify.unchecked.record_payload"), tr("verify.unchecked.record_first_seen"),
                                     tr("verify.unchecked.record_real_failure"))),
        8: StepVerifier(replay, (tr("verify.unchecked.replay_moved"), tr("verify.unchecked.replay_one_shot"))),
    }
