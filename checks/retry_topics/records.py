"""Records on callbacks.retry and callbacks.dlq, read in the lab's terms: which callback a record carries,
its retry fields, and which script produced it when.

What LAB.md accepts as a retry or DLQ record's shape:
- the original value (the same JSON object: byte for byte, or re-serialised, which notify cannot tell
  apart) with the retry fields as headers (any client writes a header's value as bytes on the wire, so a
  learner's str and bytes values read alike);
- a JSON envelope: an object one of whose fields is the callback, as the object or as its JSON text,
  with the retry fields beside it (or in headers);
- a flat merge: the callback's own fields with the retry fields added.
`retryTimes` and `nextRetryTime` are looked up in the headers first, then in the envelope; an integer, or
its decimal text (a float with no fraction passes: JSON numbers from other languages).

A learner's header is anything at all, so reading one never raises: decimal text is ASCII digits with an
optional sign and spaces around ("-0", "+5" and " 5" read as 0, 5 and 5, as Java's Long.parseLong and
Python's int read them); "--1", "²", "1_000", "1e3" and "NaN" are not whole numbers; nor is anything outside a
signed 64-bit integer, the widest a client in any language writes a count or an epoch-ms time with (and no
int() of 4300 digits or more, which Python refuses). A nextRetryTime may also have a fraction of a millisecond
(`epoch_ms`: `time.time() * 1000 + interval` is epoch ms too). `epoch_seconds` turns it into seconds only when it
is a plausible epoch-ms time, so no check divides an absurd value (a float overflows past 1e308).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from retrylab.checks.retry_topics import lab

BYTES, ENVELOPE, MERGED = "bytes", "envelope", "merged"
SHOWN = 80                  # characters of a learner's value shown in a message
WIDEST = 2 ** 63            # a whole number is within a signed 64-bit integer: [-WIDEST, WIDEST)
LATEST_MS = 253_402_300_800_000     # 10000-01-01 in epoch ms: a due time at or past it is no time at all
_DECIMAL = re.compile(r"[+-]?[0-9]{1,19}")   # 19 digits: every int64; ASCII only (str.isdigit takes "²")
_DECIMAL_FRACTION = re.compile(r"[+-]?[0-9]{1,19}\.[0-9]{1,9}")   # epoch ms with a fraction of a millisecond


@dataclass(frozen=True)
class Produced:
    """Who produced a record, and when the relay read the request (real time)."""
    script: str
    at: float


@dataclass(frozen=True)
class LabRecord:
    record: object                      # the KafkaRecord read from the broker
    callback: dict | None               # the published callback it carries (None: none recognised)
    form: str | None                    # BYTES, ENVELOPE, MERGED (None: no callback recognised)
    fields: dict                        # retry fields: headers (decoded) and the envelope's own fields
    produced: Produced | None = None

    @property
    def key(self) -> bytes | None:
        return self.record.key

    @property
    def retry_times(self) -> int | None:
        return whole_number(self.fields.get(lab.RETRY_TIMES))

    @property
    def next_retry_time(self) -> int | float | None:
        return epoch_ms(self.fields.get(lab.NEXT_RETRY_TIME))

    @property
    def due(self) -> float | None:
        """nextRetryTime in epoch seconds; None when it is no plausible time (a learner's garbage is due at none)."""
        return epoch_seconds(self.next_retry_time)

    def texts(self) -> list[str]:
        """Every header value and envelope field as text: where an error's text may be."""
        return [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in self.fields.values()]

    @property
    def where(self) -> str:
        return f"{self.record.topic}[{self.record.partition}]@{self.record.offset}"


def whole_number(value) -> int | None:
    """`value` (a decoded header or an envelope field) as an int, or None when it is not a whole number (the
    module's docstring says which are)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    elif isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        value = int(value.strip())
    return value if isinstance(value, int) and -WIDEST <= value < WIDEST else None


def epoch_ms(value) -> int | float | None:
    """A nextRetryTime as a number of milliseconds: a whole number as whole_number reads it, or one with a fraction
    of a millisecond (`time.time() * 1000 + interval`, Python's own way to write it, is epoch ms too); None else."""
    whole = whole_number(value)
    if whole is not None:
        return whole
    if isinstance(value, float) and math.isfinite(value) and -WIDEST <= value < WIDEST:
        return value
    if isinstance(value, str) and _DECIMAL_FRACTION.fullmatch(value.strip()):
        return float(value.strip())
    return None


def epoch_seconds(ms) -> float | None:
    """A nextRetryTime (epoch milliseconds, as epoch_ms reads it) in epoch seconds; None when it is not a
    plausible time: not a number, before 1970 or from the year 10000 on."""
    plausible = isinstance(ms, (int, float)) and not isinstance(ms, bool) and 0 <= ms < LATEST_MS   # False for NaN
    return ms / 1000 if plausible else None


def _json(data):
    try:
        return json.loads(data)
    except (ValueError, TypeError, RecursionError):
        return None


def _headers(record) -> dict:
    """The record's headers by name; of a name given more than once, the last value, as Kafka's own reading
    (Java's Headers.lastHeader) and Python's dict(msg.headers()) take it: a retry consumer that keeps the headers
    it read and appends the new retryTimes, or a history of lastError, means its last one."""
    return {name: value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            for name, value in record.headers}


def recognise(record, published: list[dict]) -> LabRecord:
    """Which published callback `record` carries, in which form, and its retry fields."""
    fields = _headers(record)
    value = _json(record.value) if record.value is not None else None
    for callback in published:
        if value == callback:
            return LabRecord(record, callback, BYTES, fields)
    if isinstance(value, dict):
        for callback in published:
            inner = next((k for k, v in value.items() if v == callback or (isinstance(v, str) and _json(v) == callback)),
                         None)
            if inner is not None:
                own = {k: v for k, v in value.items() if k != inner}
                return LabRecord(record, callback, ENVELOPE, {**own, **fields})
        for callback in published:
            if all(value.get(k) == v for k, v in callback.items()):
                own = {k: v for k, v in value.items() if k not in callback}
                return LabRecord(record, callback, MERGED, {**own, **fields})
    return LabRecord(record, None, None, fields)


def acked(requests):
    """(topic, partition, first offset, records, real time) of each batch the broker accepted from these
    Produce requests (the relay's record of them, with the broker's answers)."""
    for request in requests:
        counts = {(b.topic, b.partition): b.records for b in request.produced}
        for ack in request.acked:
            records = counts.get((ack.topic, ack.partition), 0)
            if ack.error == 0 and ack.base_offset >= 0 and records > 0:
                yield ack.topic, ack.partition, ack.base_offset, records, request.at


def producers(runs: dict[str, object]) -> dict[tuple[str, int, int], Produced]:
    """(topic, partition, offset) -> which script produced it and when. `runs`: script -> ScriptRun."""
    found = {}
    for script, run in runs.items():
        for topic, partition, base, records, at in acked(run.commands if run is not None else ()):
            for offset in range(base, base + records):
                found[(topic, partition, offset)] = Produced(script, at)
    return found


def on_topic(state, topic: str, published: list[dict], made_by: dict | None = None) -> list[LabRecord]:
    """The records of `topic` (every partition, in partition and offset order), each recognised."""
    found = []
    for (name, _partition), records in sorted(state.records.items()):
        if name != topic:
            continue
        for record in records:
            lab_record = recognise(record, published)
            produced = (made_by or {}).get((record.topic, record.partition, record.offset))
            found.append(LabRecord(lab_record.record, lab_record.callback, lab_record.form, lab_record.fields, produced))
    return found


def shown(data, limit: int = SHOWN) -> str:
    """A learner's bytes or text as a message shows it: one line, bounded."""
    text = data.decode("utf-8", "backslashreplace") if isinstance(data, (bytes, bytearray)) else str(data)
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= limit else text[:limit] + "..."
