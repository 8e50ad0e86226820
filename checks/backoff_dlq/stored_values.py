"""Interpreting the JSON values a learner's worker and replay script write to Redis.

Every function here is total: whatever a learner stored (not JSON, a Python repr, a 5 MB string,
a payload nested as a JSON string, a timestamp in any unit), it returns a value and/or a short
problem text a learner can act on, and never raises. Problems are one line, at most
``MAX_PROBLEM`` characters, with the learner's own text quoted through :func:`shorten`.

Shapes accepted (see README.md in this folder):
- a flat message ``{"id", "kind", "data", "attempts", ...}`` as seeded, with bookkeeping keys added;
- an envelope ``{"payload": <original message>, "attempts": n, ...}`` whose ``payload`` is the
  original message as an object, or as a JSON string encoding that object.
"""
from __future__ import annotations

import ast
import codecs
import functools
import json
import math
import re
from datetime import datetime, timezone

from retrylab import i18n
from retrylab.checks.backoff_dlq.catalog import tr

__all__ = [
    "ELLIPSIS",
    "MAX_JSON_BYTES",
    "MAX_PROBLEM",
    "NUMBER",
    "attempts_of",
    "bounded",
    "decode_json",
    "may_hold_object_or_string",
    "message_id",
    "original_fields",
    "parse_timestamp",
    "same_original",
    "shorten",
]

#: Values larger than this are reported as too large and never decoded.
MAX_JSON_BYTES = 1024 * 1024
#: No problem text returned by this module (or by artifacts.py) is longer than this.
MAX_PROBLEM = 300
#: Only text this short is tried with ``ast.literal_eval`` to recognise a Python repr.
_MAX_REPR_PROBE = 100_000

# Tests set this to True so that a bug in this module fails loudly instead of being reported to a
# learner as a polite "could not interpret" message.
_RAISE_INTERNAL_ERRORS = False

ELLIPSIS = "\u2026"
#: A number as Python's ``float`` reads it in ASCII (``1``, ``1.``, ``.5``, ``8e0``, ``+3``, ``-1``).
NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _forms() -> str:
    return tr("json.ts.forms")


def _total(fallback):
    """Decorator: turn any unexpected exception into ``fallback(exc)`` (unless tests ask to raise)."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a grader must not show a traceback
                if _RAISE_INTERNAL_ERRORS:
                    raise
                return fallback(exc)

        return wrapper

    return deco


def bounded(problem: str) -> str:
    """A problem cut to MAX_PROBLEM characters (more room in longer-worded languages: retrylab.i18n)."""
    return i18n.bounded(problem, MAX_PROBLEM, ELLIPSIS)


# --------------------------------------------------------------------------------------------
# shorten


def _escape_char(c: str) -> str:
    if c == "\\":
        return "\\\\"
    if c.isprintable():
        return c
    return repr(c)[1:-1]  # \n, \t, \x00, \u202e, \ud800, ...


def _as_text(obj) -> str:
    if isinstance(obj, str):
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).decode("utf-8", "backslashreplace")
    for render in (str, repr):
        try:
            text = render(obj)
        except Exception:  # noqa: BLE001 - e.g. str() of a 5000-digit int raises ValueError
            continue
        if isinstance(text, str):
            return text
    return f"<{type(obj).__name__}>"


def _shorten_fallback(exc: BaseException) -> str:
    return ELLIPSIS


@_total(_shorten_fallback)
def shorten(text: str, limit: int = 120) -> str:
    """``text`` on one line, at most ``limit`` characters.

    Backslashes and non-printable characters (control characters, line and paragraph separators,
    bidirectional overrides, lone surrogates, non-breaking spaces) are escaped as in ``repr``;
    printable non-ASCII text (Chinese, Persian, combining marks) is kept. Too long a text keeps its
    beginning and its end with an ellipsis in the middle. Only ``limit`` characters from each end
    are ever looked at, so a 5 MB line costs nothing.
    """
    text = _as_text(text)
    try:
        limit = int(limit)
    except Exception:  # noqa: BLE001
        limit = 120
    limit = min(limit, 100_000)
    if limit <= 0:
        return ""
    n = len(text)
    if n <= 2 * limit:
        tokens = [_escape_char(c) for c in text]
        if sum(map(len, tokens)) <= limit:
            return "".join(tokens)
        head_tokens, tail_tokens = tokens, tokens
    else:
        head_tokens = [_escape_char(c) for c in text[:limit]]
        tail_tokens = [_escape_char(c) for c in text[-limit:]]
    if limit == 1:
        return ELLIPSIS
    head_budget = limit // 2
    tail_budget = (limit - 1) // 2
    head: list[str] = []
    used = 0
    for tok in head_tokens:
        if used + len(tok) > head_budget:
            break
        head.append(tok)
        used += len(tok)
    tail: list[str] = []
    used = 0
    for tok in reversed(tail_tokens):
        if used + len(tok) > tail_budget:
            break
        tail.append(tok)
        used += len(tok)
    return "".join(head) + ELLIPSIS + "".join(reversed(tail))


def _show(value, limit: int = 70) -> str:
    """A JSON-ish rendering of a value for a message, shortened."""
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except Exception:  # noqa: BLE001 - non-JSON objects, mixed key types, cycles, deep nesting
        try:
            text = json.dumps(value, ensure_ascii=False)
        except Exception:  # noqa: BLE001
            text = _as_text(value) if not isinstance(value, str) else value
    return shorten(text, limit)


def _type_name(value) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean",
             int: "integer", float: "number", type(None): "null"}
    for kind, name in names.items():
        if type(value) is kind:
            return tr(f"json.type.{name}")
    return tr("json.type.other", name=type(value).__name__)


# --------------------------------------------------------------------------------------------
# decode_json


def _decode_fallback(exc: BaseException) -> tuple[object | None, str]:
    return None, tr("json.internal_error", error=type(exc).__name__)


def _looks_like_python_repr(text: str) -> bool:
    text = text.strip()
    if not text or len(text) > _MAX_REPR_PROBE:
        return False
    try:
        ast.literal_eval(text)
    except Exception:  # noqa: BLE001 - SyntaxError, ValueError, MemoryError, RecursionError, ...
        return False
    return True


_JSON_WHITESPACE = " \t\n\r"


def may_hold_object_or_string(raw: bytes | str) -> bool:
    """Whether `raw` can decode (``decode_json``) to a JSON object or string at all: its first character after a
    byte-order mark and JSON's whitespace is ``{`` or ``"``. A cheap test for callers that look only for those
    among every value a script wrote (scores, field names, Lua source): telling why a value is not JSON is
    decode_json's costly part, and cost a grading about 0.05 CPU-s there."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        head = bytes(raw).removeprefix(codecs.BOM_UTF8).lstrip(_JSON_WHITESPACE.encode())
        return head[:1] in (b"{", b'"')
    if isinstance(raw, str):
        return raw.removeprefix("\ufeff").lstrip(_JSON_WHITESPACE)[:1] in ("{", '"')
    return False


@_total(_decode_fallback)
def decode_json(raw: bytes | str | None) -> tuple[object | None, str]:
    """Decode a value read from Redis: ``(value, "")`` or ``(None, problem)``.

    A problem reads after "the DLQ entry is ...": "empty", "not JSON (...)", "too large (N bytes)";
    it does not quote the value (callers show it).

    Bytes must be UTF-8 (a UTF-8 byte-order mark is tolerated, as ``json.loads(bytes)`` does);
    values over ``MAX_JSON_BYTES`` are refused without decoding. JSON ``null`` decodes to
    ``(None, "")``: tell it from a failure by the problem text. ``NaN``/``Infinity`` are accepted
    as Python's ``json`` writes them; the checks judge the fields they care about.
    """
    if raw is None:
        return None, tr("json.missing")
    if isinstance(raw, memoryview):
        raw = raw.tobytes()
    if isinstance(raw, (bytes, bytearray)):
        if len(raw) > MAX_JSON_BYTES:
            return None, tr("json.too_large_bytes", size=len(raw))
        data = bytes(raw)
        if data.startswith(codecs.BOM_UTF8):
            data = data[len(codecs.BOM_UTF8):]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, tr("json.not_utf8", byte=data[exc.start], offset=exc.start)
    elif isinstance(raw, str):
        if len(raw) > MAX_JSON_BYTES:
            return None, tr("json.too_large_chars", size=len(raw))
        text = raw[1:] if raw.startswith("\ufeff") else raw
    else:
        return None, tr("json.not_text", type=_type_name(raw))
    if not text.strip():
        return None, tr("json.empty") if not text else tr("json.whitespace")
    try:
        return json.loads(text), ""
    except RecursionError:
        return None, tr("json.too_deep")
    except ValueError as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        if _looks_like_python_repr(text):
            return None, tr("json.python_repr")
        return None, tr("json.not_json", reason=shorten(reason, 60))


# --------------------------------------------------------------------------------------------
# message shapes


def _payload_dict(value) -> dict | None:
    """The envelope's ``payload`` as a dict (an object, or a JSON string of one), else None."""
    if not isinstance(value, dict):
        return None
    payload = value.get("payload")
    if isinstance(payload, dict):
        return payload
    if isinstance(payload, (str, bytes, bytearray)):
        decoded, problem = decode_json(payload)
        if not problem and isinstance(decoded, dict):
            return decoded
    return None


@_total(lambda exc: None)
def original_fields(value) -> dict | None:
    """The original message's fields carried by ``value``.

    ``value["payload"]`` when it is an object (or a JSON string encoding one): an envelope;
    otherwise ``value`` itself when it has an ``"id"``: a flat message; otherwise None.
    """
    payload = _payload_dict(value)
    if payload is not None:
        return payload
    if isinstance(value, dict) and "id" in value:
        return value
    return None


@_total(lambda exc: None)
def message_id(value) -> str | None:
    """The seeded message id carried by ``value``, or None.

    The id of the original message (see :func:`original_fields`), so an envelope that also has an
    id of its own at the top level still yields the seeded id; failing that, a top-level string
    ``"id"``.
    """
    fields = original_fields(value)
    if isinstance(fields, dict) and isinstance(fields.get("id"), str):
        return fields["id"]
    if isinstance(value, dict) and isinstance(value.get("id"), str):
        return value["id"]
    return None


@_total(lambda exc: None)
def attempts_of(value) -> int | None:
    """The attempt count at the top level of ``value`` (flat message or envelope), or None.

    Integers count, and integral finite floats (``2.0`` -> 2); booleans, strings and anything else
    do not. A count inside an envelope's ``payload`` is not the envelope's count and is ignored.
    """
    if not isinstance(value, dict):
        return None
    count = value.get("attempts")
    if isinstance(count, bool):
        return None
    if isinstance(count, int):
        return int(count)
    if isinstance(count, float) and math.isfinite(count) and count.is_integer():
        return int(count)
    return None


def _json_equal(a, b, depth: int = 0) -> bool:
    """Equality of JSON values where a boolean is never a number (``True != 1``); 1 == 1.0."""
    if depth > 100:
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_json_equal(x, y, depth + 1) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def _first_difference(expected, found, path: str, depth: int = 0) -> str:
    """'' if equal; else where and how ``found`` first differs from ``expected``."""
    if _json_equal(expected, found):
        return ""
    if depth < 20 and isinstance(expected, dict) and isinstance(found, dict):
        for key in expected:
            if key not in found:
                return tr("json.differs_missing_key", path=path, key=shorten(repr(key), 40),
                          expected=_show(expected[key], 60))
            inner = _first_difference(expected[key], found[key],
                                      f"{path}[{shorten(repr(key), 40)}]", depth + 1)
            if inner:
                return inner
        extra = next((k for k in found if k not in expected), None)
        return tr("json.differs_extra_key", path=path, key=shorten(repr(extra), 40))
    if (depth < 20 and isinstance(expected, (list, tuple)) and isinstance(found, (list, tuple))
            and len(expected) == len(found)):
        for index, (x, y) in enumerate(zip(expected, found)):
            inner = _first_difference(x, y, f"{path}[{index}]", depth + 1)
            if inner:
                return inner
    return tr("json.differs", path=path, expected=_show(expected), found=_show(found))


@_total(lambda exc: tr("json.compare_internal_error", error=type(exc).__name__))
def same_original(value, seeded: dict) -> str:
    """``""`` if ``value`` carries the seeded message's ``id``, ``kind`` and ``data`` unchanged.

    Otherwise a short description of the first difference, e.g.
    ``payload.data['n'] differs: expected 3, found "3"``. Extra keys (bookkeeping such as
    ``attempts``, ``first_seen_at``) are allowed. ``True`` is not ``1``; ``1`` equals ``1.0``.
    """
    if not isinstance(seeded, dict):
        return tr("json.no_seeded")
    if not isinstance(value, dict):
        return tr("json.not_object", type=_type_name(value))
    fields = original_fields(value)
    if fields is None:
        if "payload" in value:
            return bounded(tr("json.payload_not_original", found=_show(value["payload"])))
        return tr("json.no_original")
    prefix = "payload" if fields is not value else ""
    where = "payload" if prefix else tr("json.the_message")
    for key in ("id", "kind", "data"):
        if key not in seeded:
            continue
        label = f"{prefix}.{key}" if prefix else key
        if key not in fields:
            return bounded(tr("json.has_no_key", where=where, key=key, expected=_show(seeded[key])))
        difference = _first_difference(seeded[key], fields[key], label)
        if difference:
            return bounded(difference)
    return ""


# --------------------------------------------------------------------------------------------
# timestamps


def _timestamp_from_number(number) -> tuple[float | None, str]:
    if isinstance(number, float) and not math.isfinite(number):
        return None, tr("json.ts.not_finite", forms=_forms())
    if number < 0:
        return None, tr("json.ts.negative", forms=_forms())
    if 1e9 <= number <= 4e9:
        return float(number), ""
    if 1e12 <= number <= 4e12:
        return float(number) / 1000.0, ""
    if 1e15 <= number <= 4e15:
        return None, tr("json.ts.microseconds")
    if 1e18 <= number <= 4e18:
        return None, tr("json.ts.nanoseconds")
    return None, tr("json.ts.out_of_range")


@_total(lambda exc: (None, tr("json.ts.internal_error", error=type(exc).__name__)))
def parse_timestamp(value) -> tuple[float | None, str]:
    """Epoch seconds from a timestamp a learner stored, or ``(None, problem)``.

    A problem does not repeat the value (callers show it): "not a timestamp: expected ...".

    Accepted: numbers (not booleans) of epoch seconds in [1e9, 4e9] or epoch milliseconds in
    [1e12, 4e12]; strings holding such a number; ISO 8601 text as ``datetime.fromisoformat``
    reads it (``Z``, an offset, or no offset = UTC, as the lab machine runs with ``TZ=UTC``).
    """
    if isinstance(value, bool):
        return None, tr("json.ts.boolean", forms=_forms())
    if value is None:
        return None, tr("json.ts.null", forms=_forms())
    if isinstance(value, (int, float)):
        return _timestamp_from_number(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None, tr("json.ts.binary", forms=_forms())
    if not isinstance(value, str):
        return None, tr("json.ts.other_type", type=_type_name(value), forms=_forms())
    text = value.strip()
    if not text:
        return None, tr("json.ts.empty", forms=_forms())
    if len(text) > 64:
        return None, tr("json.ts.too_long", length=len(text), forms=_forms())
    if NUMBER.fullmatch(text):
        return _timestamp_from_number(float(text))
    iso = text[:-1] + "Z" if text.endswith("z") else text
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return None, tr("json.ts.not_timestamp", forms=_forms())
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    try:
        seconds = moment.timestamp()
    except (OverflowError, ValueError, OSError):
        seconds = None
    if seconds is None or not 1e9 <= seconds <= 4e9:
        return None, tr("json.ts.year_out_of_range", year=moment.year)
    return seconds, ""
