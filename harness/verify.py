"""`retrylab verify`: is lab step N done in a live lab environment? As a lab platform's check button.

Unlike `check` (hermetic: it copies the submission, runs the learner's scripts against a private
Redis and watches them), `verify` looks at the environment as it stands: the learner's files and
the learner's own Redis. It never runs the learner's code and never writes to that Redis: the
only commands it sends are TYPE, LLEN and LRANGE (plus what redis-py sends to connect), so it can
run as a Redis user that may only read. What it can decide that way it states as facts; what only
running the code can show it names, and points to `retrylab check`.

The file facts use the very parsers and readers the checks use (checks/backoff_dlq/artifacts.py,
messages.py, observe.read_artifact), so steps 3-5 get the same verdict from `verify` as from `check`.
A step whose file facts already fail is "not yet" without asking Redis (Redis being down then
changes nothing); a step that needs Redis and cannot read it is "cannot check" (exit status 2).
"""
from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import redis

from retrylab import exercise as exercises

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
LIST_READ = 100          # entries read from a list; the lab's lists hold one or a few
OK, FAIL, NOTE = "ok", "fail", "note"


class CannotCheck(Exception):
    """The step cannot be decided here (e.g. the learner's Redis does not answer): exit status 2."""


@dataclass(frozen=True)
class Fact:
    status: str          # OK, FAIL, or NOTE (seen, and neither makes the step done nor not done)
    text: str


@dataclass(frozen=True)
class Verification:
    exercise_id: str
    step: exercises.Step
    directory: Path
    redis_url: str | None        # shown without credentials; None when the step read no Redis
    facts: tuple[Fact, ...]
    unchecked: tuple[str, ...]   # what this step asks that only running the learner's code can show

    @property
    def done(self) -> bool:
        return not any(f.status == FAIL for f in self.facts)


# --------------------------------------------------------------------------------------------
# the learner's Redis, read-only

@dataclass(frozen=True)
class ListState:
    key: str
    type: str                    # "list", "none" (no such key), or another Redis type
    length: int
    items: tuple[bytes, ...]     # the first LIST_READ entries


def shown_url(url: str) -> str:
    """The URL without its credentials, for messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class LiveRedis:
    """The learner's own Redis. Read-only by construction: `list_state` is the only operation, and
    it sends TYPE, LLEN and LRANGE. Connects on first use, so file-only steps never touch Redis."""

    def __init__(self, url: str):
        self.url = url
        self.shown = shown_url(url)
        self.used = False
        self._client: redis.Redis | None = None

    def _connect(self) -> redis.Redis:
        if self._client is None:
            try:
                self._client = redis.Redis.from_url(self.url, socket_connect_timeout=3, socket_timeout=5)
            except ValueError as exc:
                raise CannotCheck(f"--redis-url {self.shown}: {exc}") from None
        return self._client

    def list_state(self, key: str) -> ListState:
        self.used = True
        try:
            client = self._connect()
            kind = client.type(key)
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            if kind != "list":
                return ListState(key, kind, 0, ())
            return ListState(key, kind, int(client.llen(key)), tuple(client.lrange(key, 0, LIST_READ - 1)))
        except redis.RedisError as exc:
            reason = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise CannotCheck(f"the Redis at {self.shown} could not be read ({reason})") from None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


# --------------------------------------------------------------------------------------------
# what a step verifier works with

class Facts:
    """The facts a step verifier establishes, in order."""

    def __init__(self):
        self.items: list[Fact] = []

    def ok(self, text: str) -> None:
        self.items.append(Fact(OK, text))

    def fail(self, text: str) -> None:
        self.items.append(Fact(FAIL, text))

    def note(self, text: str) -> None:
        self.items.append(Fact(NOTE, text))

    @property
    def failed(self) -> bool:
        return any(f.status == FAIL for f in self.items)


@dataclass
class Live:
    directory: Path
    redis: LiveRedis
    facts: Facts


@dataclass(frozen=True)
class StepVerifier:
    run: Callable[[Live], None]
    unchecked: tuple[str, ...]


# --------------------------------------------------------------------------------------------
# backoff-dlq (seed 000). The check modules' own parsers and readers, read-only facts per step.

def _backoff_dlq() -> dict[int, StepVerifier]:
    from retrylab.checks.backoff_dlq import observe
    from retrylab.checks.backoff_dlq.artifacts import (
        parse_capped, parse_jitter, parse_schedule, requeue_out_shows_attempts)
    from retrylab.checks.backoff_dlq.messages import (
        attempts_of, decode_json, original_fields, parse_timestamp, shorten)
    from retrylab.fixtures.messages import DLQ, QUEUE
    from retrylab.verdict import CheckFailed

    unusable = object()

    def read(live: Live, name: str):
        """The file's bytes as the checks read them, None if it is missing, or `unusable` (with a
        fact saying why: a symbolic link, a directory, too large)."""
        try:
            return observe.read_artifact(live.directory, name)
        except CheckFailed as exc:
            live.facts.fail(exc.message)
            return unusable

    def script(live: Live, name: str) -> str | None:
        """The script's text if it exists and compiles (compile() writes no bytecode anywhere)."""
        data = read(live, name)
        if data is unusable:
            return None
        if data is None:
            live.facts.fail(f"{name} is missing from {live.directory}")
            return None
        live.facts.ok(f"{name} exists")
        try:
            compile(data, name, "exec", dont_inherit=True)
        except SyntaxError as exc:
            where = f" (line {exc.lineno})" if exc.lineno else ""
            live.facts.fail(f"{name} does not compile: {exc.msg}{where}")
            return None
        except Exception as exc:  # noqa: BLE001 - NUL bytes, nesting too deep: still the learner's file
            live.facts.fail(f"{name} does not compile: {shorten(str(exc) or type(exc).__name__, 120)}")
            return None
        live.facts.ok(f"{name} compiles")
        return data.decode("utf-8", "replace")

    def parsed_file(name: str, parser, what: str) -> Callable[[Live], None]:
        def run(live: Live) -> None:
            data = read(live, name)
            if data is unusable:
                return
            result = parser(data)
            if result.ok:
                live.facts.ok(f"{name} {what}")
            else:
                live.facts.fail(result.problem)
        return run

    def a_list(live: Live, key: str) -> ListState | None:
        state = live.redis.list_state(key)
        if state.type not in ("list", "none"):
            live.facts.fail(f"{key} is a Redis {state.type}; the lab's queues are lists (RPUSH/LPUSH)")
            return None
        return state

    def worker(live: Live) -> None:
        source = script(live, "worker.py")
        if source is None:
            return
        if QUEUE in source:
            live.facts.ok(f"worker.py mentions {QUEUE}")
        else:
            live.facts.fail(f"worker.py never mentions {QUEUE}: the worker consumes that list")
        if re.search(r"\bprocess\b", source):
            live.facts.ok("worker.py mentions process")
        else:
            live.facts.fail("worker.py never mentions process: pass each message to taskproc's process(msg)")

    def requeue(live: Live) -> None:
        data = read(live, "requeue.out")
        if data is unusable:
            return
        result = requeue_out_shows_attempts(data, 2)
        if not result.ok:
            live.facts.fail(result.problem)
            return
        live.facts.ok("requeue.out shows attempts=2")
        for key in (QUEUE, DLQ):
            state = a_list(live, key)
            if state is None:
                continue
            if not state.length:
                live.facts.note(f"{key} is empty: no message there to read an attempt count from")
                continue
            counted = 0
            for raw in state.items:
                value, problem = decode_json(raw)
                if problem or not isinstance(value, dict) or "attempts" not in value:
                    continue
                if attempts_of(value) is None:
                    live.facts.fail(f"a message in {key} carries attempts={shorten(json.dumps(value['attempts']), 40)}:"
                                    " the attempt count must be an integer, one more after each failure")
                    return
                counted += 1
            seen = min(state.length, LIST_READ)
            text = f"{counted} of the {seen} message(s) read from {key} carry an integer attempts count"
            (live.facts.ok if counted else live.facts.note)(
                text + ("" if counted == seen else " (a message not tried yet has none)"))

    def dlq(live: Live) -> None:
        queue, dead = a_list(live, QUEUE), a_list(live, DLQ)
        if queue is not None:
            if queue.length:
                live.facts.fail(f"{QUEUE} still holds {queue.length} message(s); after the failing message went"
                                " to the DLQ the main queue must be empty")
            else:
                live.facts.ok(f"{QUEUE} is empty")
        if dead is not None:
            if dead.length == 1:
                live.facts.ok(f"{DLQ} holds 1 entry")
            elif dead.type == "none":
                live.facts.fail(f"{DLQ} does not exist: no message has been dead-lettered yet")
            else:
                live.facts.fail(f"{DLQ} holds {dead.length} entries; the lab expects exactly 1,"
                                " the message that failed 5 times")

    def entry_facts(raw: bytes) -> list[Fact]:
        """What can be read off one DLQ entry, up to its first problem."""
        found: list[Fact] = []
        text = shorten(raw.decode("utf-8", "replace"), 120)
        entry, problem = decode_json(raw)
        if problem or not isinstance(entry, dict):
            why = problem or "not a JSON object"
            return [Fact(FAIL, f"it is {why}: {text}; store json.dumps of an object")]
        found.append(Fact(OK, "it is a JSON object"))
        required = ("payload", "error", "attempts", "first_seen_at")
        missing = [k for k in required if k not in entry]
        if missing:
            keys = ", ".join(sorted(map(str, entry))) or "no keys"
            return found + [Fact(FAIL, f"it lacks {', '.join(missing)} (it has {keys})")]
        found.append(Fact(OK, "it has payload, error, attempts and first_seen_at"))
        attempts = entry["attempts"]
        if type(attempts) is not int or attempts != 5:
            return found + [Fact(FAIL, f"attempts is {shorten(json.dumps(attempts), 40)}; the message failed"
                                       " 5 times, so store the integer 5")]
        found.append(Fact(OK, "attempts is 5"))
        fields = original_fields(entry)
        if fields is None or fields is entry:
            return found + [Fact(FAIL, f"payload is {shorten(json.dumps(entry['payload']), 80)}; it must be"
                                       " the original message (an object)")]
        found.append(Fact(OK, "payload is a message object"))
        error = entry["error"]
        if not isinstance(error, str) or not error.strip():
            return found + [Fact(FAIL, f"error is {shorten(json.dumps(error), 40)}; record the exception's"
                                       " text (str(exc))")]
        found.append(Fact(OK, "error is non-empty text"))
        _, problem = parse_timestamp(entry["first_seen_at"])
        if problem:
            return found + [Fact(FAIL, f"first_seen_at {shorten(json.dumps(entry['first_seen_at']), 40)}"
                                       f" is {problem}")]
        found.append(Fact(OK, "first_seen_at is a timestamp"))
        return found

    def dlq_record(live: Live) -> None:
        dead = a_list(live, DLQ)
        if dead is None:
            return
        if not dead.length:
            live.facts.fail(f"{DLQ} holds no entry to inspect; finish step 6 first")
            return
        for index, raw in enumerate(dead.items):
            found = entry_facts(raw)
            failed = any(f.status == FAIL for f in found)
            if failed or index == len(dead.items) - 1:
                label = "the DLQ entry" if dead.length == 1 else f"DLQ entry {index + 1} of {dead.length}"
                for fact in found:
                    live.facts.items.append(Fact(fact.status, f"{label}: {fact.text}"))
                if failed:
                    return
        if dead.length > 1:
            live.facts.note(f"{DLQ} holds {dead.length} entries; every one was checked (step 6 expects 1)")

    def replay(live: Live) -> None:
        if script(live, "replay.py") is None:
            return
        queue, dead = a_list(live, QUEUE), a_list(live, DLQ)
        if dead is not None:
            if dead.length:
                live.facts.fail(f"{DLQ} still holds {dead.length} entr{'y' if dead.length == 1 else 'ies'}; after"
                                " replay.py the DLQ must be empty (take the entry out, do not copy it)")
            else:
                live.facts.ok(f"{DLQ} is empty")
        if queue is None:
            return
        if queue.length != 1:
            live.facts.fail(f"{QUEUE} holds {queue.length} messages; after replay.py it must hold exactly 1,"
                            " the replayed message")
            return
        live.facts.ok(f"{QUEUE} holds 1 message")
        raw = queue.items[0]
        value, problem = decode_json(raw)
        if problem or not isinstance(value, dict):
            live.facts.fail(f"the message in {QUEUE} is {problem or 'not a JSON object'}:"
                            f" {shorten(raw.decode('utf-8', 'replace'), 120)}")
            return
        fields = original_fields(value) or (value if "kind" in value else None)
        if fields is None:
            live.facts.fail(f"the message in {QUEUE} carries no payload (no original message under payload"
                            f" or at its top level): {shorten(raw.decode('utf-8', 'replace'), 120)}")
            return
        live.facts.ok(f"the message in {QUEUE} carries a payload")
        # as the check reads it: the count at the top level, else the one inside the payload
        holder = value if "attempts" in value else fields
        if "attempts" in holder and attempts_of(holder) != 0:
            live.facts.fail(f"the message in {QUEUE} carries attempts={shorten(json.dumps(holder['attempts']), 40)};"
                            " reset it to 0")
        else:
            live.facts.ok(f"the message in {QUEUE} carries attempts 0" if "attempts" in holder
                          else f"the message in {QUEUE} carries no attempts count (counting starts at 0)")

    return {
        1: StepVerifier(worker, (
            "that worker.py takes every message off q:tasks and passes it to process(msg), once each",
            "that it survives a failing process(msg)")),
        2: StepVerifier(requeue, (
            "that each failure puts the message back with exactly one more attempt",)),
        3: StepVerifier(parsed_file("schedule.txt", parse_schedule,
                                    "holds attempt=0..5 with waits 1 2 4 8 16 32"), ()),
        4: StepVerifier(parsed_file("jitter.txt", parse_jitter,
                                    "holds 20 waits in [0, 8], at least 15 distinct"), ()),
        5: StepVerifier(parsed_file("capped.txt", parse_capped,
                                    "holds 1 2 4 8 16 30 30 30 30 for attempts 0..8"), ()),
        6: StepVerifier(dlq, (
            "that process was called exactly 5 times for the failing message before it went to the DLQ",
            "that the good messages around it were processed once each")),
        7: StepVerifier(dlq_record, (
            "that payload is the original message unchanged and error is the exception's own text",
            "that first_seen_at is the time of the first attempt, not reset by retries",
            "that the entry records a real failure of process(msg)")),
        8: StepVerifier(replay, (
            "that replay.py moved the entry (the state above could have been made by hand)",
            "that replay.py is a one-shot command that exits, not a loop consuming the DLQ")),
    }


VERIFIERS: dict[str, Callable[[], dict[int, StepVerifier]]] = {"backoff-dlq": _backoff_dlq}


def verifiers(exercise_id: str) -> dict[int, StepVerifier]:
    try:
        return VERIFIERS[exercise_id]()
    except KeyError:
        raise CannotCheck(f"verify mode does not know exercise {exercise_id!r} yet") from None


def verify(directory: Path, step_number: int, *, redis_url: str = DEFAULT_REDIS_URL,
           exercise_id: str = exercises.DEFAULT_EXERCISE) -> Verification:
    """Decide whether step `step_number` is done, read-only. Raises CannotCheck (exit status 2)."""
    exercise = exercises.get(exercise_id)
    step = exercise.step(step_number)
    verifier = verifiers(exercise_id)[step_number]
    live = Live(Path(directory), LiveRedis(redis_url), Facts())
    try:
        verifier.run(live)
    finally:
        live.redis.close()
    return Verification(exercise_id=exercise.id, step=step, directory=Path(directory),
                        redis_url=live.redis.shown if live.redis.used else None,
                        facts=tuple(live.facts.items), unchecked=verifier.unchecked)


_MARK = {OK: "ok  ", FAIL: "FAIL", NOTE: "note"}


def render(result: Verification) -> str:
    step = result.step
    lines = [f"step {step.number}: {step.title}  ({result.exercise_id}, read-only verify)",
             f"directory: {result.directory}",
             f"redis: {result.redis_url} (read only)" if result.redis_url else "redis: not needed for this step",
             "", "checked read-only:"]
    lines += [f"  {_MARK[f.status]}  {f.text}" for f in result.facts]
    if result.unchecked:
        lines += ["not checked (only running your code can show it):"]
        lines += [f"  -     {text}" for text in result.unchecked]
    lines.append("")
    if result.done:
        lines.append(f"DONE: step {step.number} passes every read-only check.")
    else:
        lines += [f"NOT YET: step {step.number} is not done.", f"Hint: {step.hint}"]
    lines.append(f"To check everything, running your scripts against a private Redis:"
                 f" retrylab check {result.directory} --step {step.number}")
    return "\n".join(lines) + "\n"
