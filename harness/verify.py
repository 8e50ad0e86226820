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

Everything is said in the language asked for (`lang`, as `retrylab check --lang`): the report's frame
from the engine's catalog (harness/locales [verify]), the facts about the lab from the exercise's
(checks/<exercise>/locales [verify]), the problems found by the checks' own parsers as in `check`.
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
from retrylab import bidi, i18n

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
    lang: str = i18n.DEFAULT     # the language of the facts, and of the report render() makes

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
                raise CannotCheck(i18n.label("verify.bad_url", url=self.shown, error=exc)) from None
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
            raise CannotCheck(i18n.label("verify.unreadable", url=self.shown, reason=reason)) from None

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
        attempts_of, decode_json, original_fields, parse_timestamp, shorten, tr)
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
            if data is unusable:
                return
            result = parser(data)
            if result.ok:
                live.facts.ok(tr(passed, name=name))
            else:
                live.facts.fail(result.problem)
        return run

    def a_list(live: Live, key: str) -> ListState | None:
        state = live.redis.list_state(key)
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
        if data is unusable:
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
        required = ("payload", "error", "attempts", "first_seen_at")
        missing = [k for k in required if k not in entry]
        if missing:
            keys = ", ".join(sorted(map(str, entry))) or tr("verify.no_keys")
            return found + [Fact(FAIL, tr("verify.record.lacks", missing=", ".join(missing), keys=keys))]
        found.append(Fact(OK, tr("verify.record.has_keys")))
        attempts = entry["attempts"]
        if type(attempts) is not int or attempts != 5:
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
                    live.facts.items.append(Fact(fact.status, tr("verify.entry_fact", entry=label, fact=fact.text)))
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
        # as the check reads it: the count at the top level, else the one inside the payload
        holder = value if "attempts" in value else fields
        if "attempts" in holder and attempts_of(holder) != 0:
            count = shorten(json.dumps(holder["attempts"]), 40)
            live.facts.fail(tr("verify.replayed.attempts", queue=QUEUE, value=count))
        else:
            key = "verify.replayed.attempts_ok" if "attempts" in holder else "verify.replayed.no_attempts"
            live.facts.ok(tr(key, queue=QUEUE))

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


VERIFIERS: dict[str, Callable[[], dict[int, StepVerifier]]] = {"backoff-dlq": _backoff_dlq}


def verifiers(exercise_id: str) -> dict[int, StepVerifier]:
    try:
        return VERIFIERS[exercise_id]()
    except KeyError:
        raise CannotCheck(i18n.label("verify.unknown_exercise", exercise=repr(exercise_id))) from None


def verify(directory: Path, step_number: int, *, redis_url: str = DEFAULT_REDIS_URL,
           exercise_id: str = exercises.DEFAULT_EXERCISE, lang: str = i18n.DEFAULT) -> Verification:
    """Decide whether step `step_number` is done, read-only, saying so in `lang`. Raises CannotCheck
    (exit status 2)."""
    with i18n.use(lang):
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
                        facts=tuple(live.facts.items), unchecked=verifier.unchecked, lang=lang)


def render(result: Verification) -> str:
    """The report of a verification, in its language; lines kept free of unbalanced bidi controls."""
    step, lang = result.step, result.lang
    exercise = exercises.get(result.exercise_id)
    marks = {status: i18n.label(f"verify.{status}", lang) for status in (OK, FAIL, NOTE)}
    column = max(map(bidi.width, marks.values()))
    lines = [i18n.label("verify.heading", lang, number=step.number, title=i18n.step_text(exercise, step, "title", lang),
                        exercise=result.exercise_id),
             i18n.label("verify.directory", lang, path=str(result.directory)),
             i18n.label("verify.redis", lang, url=result.redis_url) if result.redis_url
             else i18n.label("verify.no_redis", lang),
             "", i18n.label("verify.checked", lang)]
    lines += [f"  {bidi.pad(marks[f.status], column)}  {f.text}" for f in result.facts]
    if result.unchecked:
        lines += [i18n.label("verify.unchecked", lang)]
        lines += [f"  {bidi.pad('-', column)}  {text}" for text in result.unchecked]
    lines.append("")
    if result.done:
        lines.append(i18n.label("verify.done", lang, number=step.number))
    else:
        lines += [i18n.label("verify.not_yet", lang, number=step.number),
                  i18n.label("report.hint", lang, hint=i18n.step_text(exercise, step, "hint", lang))]
    lines.append(i18n.label("verify.pointer", lang, directory=str(result.directory), number=step.number))
    return "\n".join(bidi.balance(line) for line in lines) + "\n"
