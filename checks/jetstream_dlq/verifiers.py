"""jetstream-dlq's `retrylab verify` step verifiers: is step N done in a live lab environment?

Read-only facts from the learner's files and own NATS server (retrylab.brokers.nats.live.LiveNats: StreamInfo,
ConsumerInfo and STREAM.MSG.GET, nothing that writes), in the lab's names and numbers (lab.py) and, for the
consumer's settings, in step 1's own words (the step1.* messages). `verify` never runs the learner's code, so
what the checks learn by watching a run (each delivery and its answer, the gaps between redeliveries, the
advisory and its re-send) each step names as unchecked and leaves to `retrylab check`.

What a step leaves behind on the learner's server, and so what is decided here:
- 1 consumer: worker-consumer on EVENTS as ConsumerInfo reads it back: durable, pull, AckExplicit,
  MaxDeliver 3, BackOff [0.5 s, 1 s], FilterSubject events.created, AckWait 30 s or 0.5 s (BackOff[0]).
- 2 dlq-stream: stream DLQ whose subjects take dlq.events.
- 5 dead-letter: every message on dlq.events (the first ENTRIES_READ) has Nats-Msg-Id dlq-<seq>, no two the
  same id, and its payload is EVENTS' message at <seq> byte for byte when EVENTS still holds it (the
  advisory's JSON published instead is named as such).
- 7 clean-end: worker-consumer has num_pending 0 and num_ack_pending 0; every EVENTS message a dead letter
  points to is still there (the poison is never deleted).
- 3, 4, 6 (not asked by the lab for verify, answered so that every step has a verifier): worker.py
  compiles and the consumer exists, with the settings those steps rely on (4: MaxDeliver and BackOff;
  6: explicit acks, without which term() is ignored) and its delivery counters as notes.
A step whose file facts already fail is "not yet" without asking the server.
"""
from __future__ import annotations

import json
from typing import Callable

from retrylab.brokers.nats.live import LiveNats
from retrylab.checks.jetstream_dlq import lab
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.verify import Live, StepVerifier

SCRIPT_LIMIT = 1 << 20      # bytes: a learner's script is a few kilobytes; a larger "script" is not one
ENTRIES_READ = 100          # dead letters read; the lab leaves one
SHOWN = 60                  # characters of a payload shown in a message
DLQ_ID_PREFIX = "dlq-"


def live_broker(url: str) -> LiveNats:
    """The learner's own NATS server at `url`, read-only; connected on first use."""
    return LiveNats(url)


# --------------------------------------------------------------------------------------------
# the learner's files


def script(live: Live, name: str) -> bool:
    """Whether the script exists, is a regular file of sensible size and compiles (no bytecode written)."""
    path = live.directory / name
    if path.is_symlink():
        live.facts.fail(tr("verify.symlink", name=name))
        return False
    if not path.exists():
        live.facts.fail(tr("verify.missing", name=name, directory=str(live.directory)))
        return False
    if not path.is_file():
        live.facts.fail(tr("verify.not_regular", name=name))
        return False
    with path.open("rb") as f:
        data = f.read(SCRIPT_LIMIT + 1)
    if len(data) > SCRIPT_LIMIT:
        live.facts.fail(tr("verify.too_large", name=name, megabytes=SCRIPT_LIMIT >> 20))
        return False
    live.facts.ok(tr("verify.exists", name=name))
    try:
        compile(data, name, "exec", dont_inherit=True)
    except SyntaxError as exc:   # Python's own words for the error (exc.msg) stay as Python says them
        if exc.lineno:
            live.facts.fail(tr("verify.does_not_compile_line", name=name, error=exc.msg, line=exc.lineno))
        else:
            live.facts.fail(tr("verify.does_not_compile", name=name, error=exc.msg))
        return False
    except Exception as exc:  # noqa: BLE001 - NUL bytes, nesting too deep: still the learner's file
        live.facts.fail(tr("verify.does_not_compile", name=name, error=shown(str(exc) or type(exc).__name__)))
        return False
    live.facts.ok(tr("verify.compiles", name=name))
    return True


def dlq_service_script(live: Live) -> bool:
    """dlq_service.py, or worker.py when the advisory listener lives there (LAB.md allows it)."""
    if (live.directory / "dlq_service.py").exists() or (live.directory / "dlq_service.py").is_symlink():
        return script(live, "dlq_service.py")
    if not (live.directory / "worker.py").exists():
        live.facts.fail(tr("verify.no_dlq_service", directory=str(live.directory)))
        return False
    live.facts.note(tr("verify.listener_in_worker"))
    return script(live, "worker.py")


def shown(value, limit: int = SHOWN) -> str:
    """A payload or a learner's text as a message shows it: printable, one line, bounded."""
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, (bytes, bytearray)) else str(value)
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= limit else text[:limit] + "..."


# --------------------------------------------------------------------------------------------
# the consumer (steps 1, 3, 4, 6, 7)


def _plain(value):
    """An enum of nats-py's (AckPolicy.EXPLICIT) as the server writes it ("explicit")."""
    return getattr(value, "value", value)


def _seconds(value) -> str:
    return f"{value:g} s" if isinstance(value, (int, float)) else str(value)


def settings_problems(config) -> list[str]:
    """What keeps worker-consumer's settings (nats-py's ConsumerConfig: seconds, enums) from step 1's, in
    step 1's own words; [] when they are the lab's."""
    consumer = lab.CONSUMER
    if not config.durable_name:
        return [tr("step1.not_durable", consumer=consumer)]
    if config.deliver_subject:
        return [tr("step1.push", consumer=consumer)]
    found = []
    policy = _plain(config.ack_policy)
    if policy != "explicit":
        found.append(tr("step1.ack_policy", consumer=consumer, policy=policy or "none"))
    if config.max_deliver != lab.MAX_DELIVER:
        found.append(tr("step1.max_deliver", consumer=consumer,
                        value=config.max_deliver if config.max_deliver is not None else -1))
    backoff = [round(b * 1e9) for b in config.backoff or []]
    if backoff != lab.BACKOFF_NS:
        found.append(tr("step1.backoff", consumer=consumer, value=", ".join(map(_seconds, config.backoff or [])) or "-"))
    subjects = list(config.filter_subjects or ([config.filter_subject] if config.filter_subject else []))
    if subjects != [lab.SUBJECT]:
        found.append(tr("step1.filter", consumer=consumer, value=", ".join(subjects) or "-", subject=lab.SUBJECT))
    ack_wait = round(config.ack_wait * 1e9) if isinstance(config.ack_wait, (int, float)) else None
    if ack_wait not in (lab.ACK_WAIT_NS, lab.BACKOFF_NS[0]):
        found.append(tr("step1.ack_wait", consumer=consumer, value=_seconds(config.ack_wait)))
    return found


def the_consumer(live: Live):
    """ConsumerInfo of worker-consumer, with a failed fact saying what to do when it or EVENTS is missing."""
    info = live.broker.consumer_info(lab.STREAM, lab.CONSUMER)
    if info is not None:
        live.facts.ok(tr("verify.consumer_exists", consumer=lab.CONSUMER, stream=lab.STREAM))
        return info
    if live.broker.stream_info(lab.STREAM) is None:
        live.facts.fail(tr("verify.no_events_stream", stream=lab.STREAM, subjects=", ".join(lab.STREAM_SUBJECTS)))
    else:
        live.facts.fail(tr("verify.no_consumer", consumer=lab.CONSUMER, stream=lab.STREAM))
    return None


def consumer(live: Live) -> None:
    if not script(live, "setup.py"):
        return
    info = the_consumer(live)
    if info is None:
        return
    problems = settings_problems(info.config)
    for problem in problems:
        live.facts.fail(problem)
    if not problems:
        live.facts.ok(tr("verify.settings_ok", consumer=lab.CONSUMER, subject=lab.SUBJECT))


def counters(live: Live, info) -> None:
    """The consumer's delivery counters, as notes: what they show and what they cannot."""
    delivered = info.delivered.stream_seq if info.delivered else 0
    floor = info.ack_floor.stream_seq if info.ack_floor else 0
    live.facts.note(tr("verify.counters", consumer=lab.CONSUMER, delivered=delivered or 0, floor=floor or 0,
                       redelivered=info.num_redelivered or 0, unacked=info.num_ack_pending or 0))


def acks(live: Live) -> None:
    if not script(live, "worker.py"):
        return
    info = the_consumer(live)
    if info is not None:
        counters(live, info)


def paced(live: Live) -> None:
    if not script(live, "worker.py"):
        return
    info = the_consumer(live)
    if info is None:
        return
    config = info.config
    if config.max_deliver != lab.MAX_DELIVER:
        live.facts.fail(tr("step1.max_deliver", consumer=lab.CONSUMER,
                           value=config.max_deliver if config.max_deliver is not None else -1))
    elif [round(b * 1e9) for b in config.backoff or []] != lab.BACKOFF_NS:
        live.facts.note(tr("verify.no_backoff", consumer=lab.CONSUMER,
                           value=", ".join(map(_seconds, config.backoff or [])) or "-"))
    else:
        live.facts.ok(tr("verify.redelivery_settings", consumer=lab.CONSUMER))
    counters(live, info)


def terminates(live: Live) -> None:
    if not script(live, "worker.py"):
        return
    info = the_consumer(live)
    if info is None:
        return
    policy = _plain(info.config.ack_policy)
    if policy != "explicit":
        live.facts.fail(tr("verify.term_ignored", consumer=lab.CONSUMER, policy=policy or "none"))
    else:
        live.facts.ok(tr("verify.explicit_acks", consumer=lab.CONSUMER))


# --------------------------------------------------------------------------------------------
# step 2: the DLQ stream


def covers(pattern: str, subject: str) -> bool:
    """Whether a stream subject (with * and > wildcards) takes messages published on `subject`."""
    parts, tokens = pattern.split("."), subject.split(".")
    for i, part in enumerate(parts):
        if part == ">":
            return len(tokens) > i
        if i >= len(tokens) or (part != "*" and part != tokens[i]):
            return False
    return len(parts) == len(tokens)


def the_dlq_stream(live: Live):
    """StreamInfo of DLQ if it takes dlq.events; else None, with a failed fact saying what to do."""
    info = live.broker.stream_info(lab.DLQ_STREAM)
    if info is None:
        live.facts.fail(tr("verify.no_dlq_stream", stream=lab.DLQ_STREAM, subject=lab.DLQ_SUBJECT))
        return None
    subjects = [s for s in info.config.subjects or [] if isinstance(s, str)]
    if not any(covers(s, lab.DLQ_SUBJECT) for s in subjects):
        live.facts.fail(tr("step2.subject", stream=lab.DLQ_STREAM, subjects=", ".join(subjects) or "-",
                           subject=lab.DLQ_SUBJECT))
        return None
    live.facts.ok(tr("verify.dlq_stream_ok", stream=lab.DLQ_STREAM, subject=lab.DLQ_SUBJECT,
                     subjects=", ".join(subjects)))
    return info


def dlq_stream(live: Live) -> None:
    if script(live, "setup.py"):
        the_dlq_stream(live)


# --------------------------------------------------------------------------------------------
# step 5: the dead letters


def dead_letters(live: Live) -> list:
    """The messages on dlq.events, the first ENTRIES_READ (nats-py RawStreamMsg: seq, data, headers)."""
    found, seq = [], 1
    while len(found) < ENTRIES_READ:
        message = live.broker.get_msg(lab.DLQ_STREAM, seq, subject=lab.DLQ_SUBJECT)
        if message is None or message.seq is None:
            return found
        found.append(message)
        seq = message.seq + 1
    return found


def msg_id(message) -> str | None:
    """The Nats-Msg-Id header as text (nats-py gives undecodable bytes as an email Header object)."""
    for name, value in (message.headers or {}).items():
        if str(name).lower() == lab.MSG_ID_HEADER.lower():
            return str(value)
    return None


def source_seq(value: str | None) -> int | None:
    """<seq> of a Nats-Msg-Id dlq-<seq>, None for any other id."""
    if value is None or not value.startswith(DLQ_ID_PREFIX):
        return None
    digits = value[len(DLQ_ID_PREFIX):]
    return int(digits) if digits.isascii() and digits.isdigit() and int(digits) > 0 else None


def advisory_type(data: bytes) -> str | None:
    """The advisory's type if `data` is an advisory's JSON (what a service publishing the advisory sends)."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if isinstance(value, dict) and ("stream_seq" in value or str(value.get("type", "")).startswith("io.nats")):
        return str(value.get("type") or "stream_seq")
    return None


def letter_problem(live: Live, message, seen: dict[str, int]) -> str:
    """What is wrong with one dead letter ("" when nothing is)."""
    value = msg_id(message)
    if value is None:
        return tr("verify.no_msg_id", stream=lab.DLQ_STREAM, seq=message.seq)
    if value in seen:
        return tr("verify.duplicate_id", stream=lab.DLQ_STREAM, first=seen[value], second=message.seq,
                  value=shown(value))
    seen[value] = message.seq
    kind = advisory_type(message.data or b"")
    if kind is not None:
        return tr("verify.advisory_as_letter", stream=lab.DLQ_STREAM, seq=message.seq, type=shown(kind))
    source = source_seq(value)
    if source is None:
        return tr("verify.bad_msg_id", stream=lab.DLQ_STREAM, seq=message.seq, value=shown(value))
    original = live.broker.get_msg(lab.STREAM, source)
    if original is None:
        live.facts.note(tr("verify.source_gone", id=shown(value), stream=lab.STREAM, source=source))
    elif (original.data or b"") != (message.data or b""):
        return tr("verify.payload_differs", id=shown(value), stream=lab.DLQ_STREAM, seq=message.seq,
                  events=lab.STREAM, source=source, got=shown(message.data or b""),
                  original=shown(original.data or b""))
    return ""


def dead_letter(live: Live) -> None:
    if not dlq_service_script(live) or the_dlq_stream(live) is None:
        return
    letters = dead_letters(live)
    if not letters:
        live.facts.fail(tr("verify.no_dead_letters", subject=lab.DLQ_SUBJECT))
        return
    live.facts.ok(tr("verify.dead_letters", subject=lab.DLQ_SUBJECT, count=len(letters)))
    seen: dict[str, int] = {}
    for message in letters:
        problem = letter_problem(live, message, seen)
        if problem:
            live.facts.fail(problem)
            return
    live.facts.ok(tr("verify.dead_letters_ok", count=len(letters), subject=lab.DLQ_SUBJECT, stream=lab.STREAM))


# --------------------------------------------------------------------------------------------
# step 7: the clean end


def clean_end(live: Live) -> None:
    if not script(live, "worker.py"):
        return
    info = the_consumer(live)
    if info is not None:
        pending, unacked = info.num_pending or 0, info.num_ack_pending or 0
        if pending or unacked:
            live.facts.fail(tr("verify.not_clean", consumer=lab.CONSUMER, pending=pending, unacked=unacked))
        else:
            live.facts.ok(tr("verify.clean", consumer=lab.CONSUMER))
    if live.broker.stream_info(lab.DLQ_STREAM) is None:
        live.facts.note(tr("verify.no_dlq_to_follow", stream=lab.DLQ_STREAM))
        return
    letters = dead_letters(live)
    sources = sorted({s for s in (source_seq(msg_id(m)) for m in letters) if s is not None})
    for source in sources:
        if live.broker.get_msg(lab.STREAM, source) is None:
            live.facts.fail(tr("verify.poison_gone", stream=lab.STREAM, source=source))
            return
    if sources:
        live.facts.ok(tr("verify.poison_kept", stream=lab.STREAM, count=len(sources)))


def step_verifiers() -> dict[int, StepVerifier]:
    """The verifier of each lab step, its texts in the current language."""
    unchecked: Callable[..., tuple[str, ...]] = lambda *keys: tuple(tr(f"verify.unchecked.{k}") for k in keys)
    return {
        1: StepVerifier(consumer, unchecked("setup_twice")),
        2: StepVerifier(dlq_stream, unchecked("dlq_stores")),
        3: StepVerifier(acks, unchecked("goods_once", "goods_acked")),
        4: StepVerifier(paced, unchecked("poison_three", "poison_gaps")),
        5: StepVerifier(dead_letter, unchecked("after_advisory", "resent_advisory")),
        6: StepVerifier(terminates, unchecked("corrupt_once", "no_advisory_for_corrupt")),
        7: StepVerifier(clean_end, unchecked("ends_by_itself")),
    }
