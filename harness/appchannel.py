"""The channel between a learner process's application stub and the harness, and the run's clock.

An exercise stands a module of its own in for the learner's business code (a `process(msg)`, an
`apply(fields)`, a `notify(payload)`: whatever its lab calls). In the learner's
process that module is only a stub: each call is sent here, over a unix socket the harness owns, and
the stub returns or raises what the harness's `Application` decides. So the record of calls lives in
the harness's memory, where nothing the learner writes can add, hide or change a call.

Requests are untrusted bytes. Each is a frame: 4 bytes of big-endian length, then a JSON object:

    {"op": "call", "fn": "process", "pid": 123, "args": [{"json": "<the argument as JSON text>",
                                                          "type": "dict", "truncated": false}]}
    {"op": "advance", "seconds": 1.5}          a sleep of the learner's: moves the run's clock

and each gets one frame back: {"offset": <the run's clock offset>} with "value" (the call returned
it) or "error": {"class": "HTTPError", "message": "...", "attrs": {"status": 503}} (the stub raises
that). A frame over MAX_FRAME, bytes that are not such an object, or a connection closed in the middle
of a frame is recorded as a malformed call and answered with an error where the connection allows.
After MAX_CALLS calls, or MAX_RECORD_BYTES of their records, the run is over: `over_limit` says so (the
runner stops the learner) and further calls are refused without being recorded, so a flood cannot make
the harness's memory grow. Every text of a record that the learner chose is bounded too: the argument
and the error to ARG_TEXT_LIMIT characters, the id to ID_LIMIT (a longer one is kept cut, with a marker
and its digest, so it stays distinct and can never equal a seeded id, all of which are shorter).

A reply may be larger than the socket's buffer (replies quote the id): it waits in the connection's
outbox until the socket can take it, and while a connection's outbox holds OUTBOX_CAP bytes or more its
requests are not read, so a learner that sends without reading replies holds back only itself.

The server is one thread with a selector, for however many processes and threads the learner runs.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from retrylab import i18n, procfs
from retrylab.calllog import BYTES, CALLS, MALFORMED, Call, CallRecord, RecordLimit
# the longest sleep a learner's process can report: time.sleep refuses a longer one
from retrylab.learner_site.virtual_clock import LONGEST_SLEEP

MAX_FRAME = 128 << 10        # bytes of one request: an argument of 32 KiB, escaped, and room to spare
MAX_CALLS = 10_000           # calls in one run; more is a flood, and the run is stopped
MAX_CONNECTIONS = 256        # open at once: every process and thread of a learner's run
ARG_TEXT_LIMIT = 4096        # characters of an argument (and of an error) kept in a call's record: enough to compare fields
ID_LIMIT = 256               # characters of an id kept as it is; a seeded id is far shorter (32)
MAX_RECORD_BYTES = 32 << 20  # of all a run's records: an honest run keeps well under 1 MB
OUTBOX_CAP = 256 << 10       # bytes of replies waiting for a connection before its requests wait too
_HEADER = struct.Struct(">I")
_PEERCRED = struct.Struct("3i")    # struct ucred: pid, uid, gid
_MAX_SLEEP = 10 * 365 * 86400.0   # one sleep moves the clock at most this far (a sleep(1e300) stays finite)


# A learner run's clock starts this far ahead of real time (plus up to RUN_CLOCK_JITTER, drawn per run):
# every real-time source a learner can reach and the relay cannot answer for (a broker's own clock: the
# time inside a server-side script, or in ids the broker makes) is then days away from the run's clock, so a
# time taken from one cannot pass for the run's. Still well inside the epoch range a stored timestamp may have.
RUN_CLOCK_LEAD = 3 * 86400.0
RUN_CLOCK_JITTER = 86400.0


class RunClock:
    """The virtual clock of one learner run, shared by all its processes.

    It starts `start` seconds ahead of real time. A learner process's sleep returns at once and moves
    this clock forward; every process starts at the run's offset (retrylab.runner passes it in the
    environment) and sets its own clocks to `offset` (sent back with each reply), so time.time() in the
    learner is `real time + offset`, and so is `now()` here: what the broker's time (answered by its relay)
    must say for the run."""

    def __init__(self, start: float = 0.0, *, virtual: bool = True):
        self.start = float(start)
        self._offset = self.start
        self._lock = threading.Lock()
        self.virtual = virtual

    @classmethod
    def real(cls) -> "RunClock":
        """A run on real time: the learner's sleeps really wait and its clocks are the machine's. For an
        exercise whose waits are the broker's own (a min-idle time on the server, a redelivery delay) or
        whose output is compared with what the harness samples in real time (a lag series)."""
        return cls(0.0, virtual=False)

    @classmethod
    def for_learner_run(cls) -> "RunClock":
        """A learner run's clock: days ahead of real time, by an amount a learner cannot know."""
        return cls(RUN_CLOCK_LEAD + random.uniform(0.0, RUN_CLOCK_JITTER))

    @property
    def offset(self) -> float:
        return self._offset

    def advance(self, seconds: float) -> float:
        with self._lock:
            if seconds > 0 and self.virtual:
                self._offset += min(float(seconds), _MAX_SLEEP)
            return self._offset

    def now(self) -> float:
        """The run's virtual epoch time."""
        return time.time() + self._offset


@dataclass(frozen=True)
class Argument:
    """One argument of a call as the stub described it: its JSON text (bounded), the value that text
    decodes to (`value`, when `decoded`), and the type it had in the learner's process."""
    text: str
    type_name: str
    truncated: bool
    decoded: bool
    value: Any = None


@dataclass
class Decision:
    """What an application decided for one call: return `value`, or raise `error` (an exception
    whose class the stub module or the builtins define); `id` and `altered` go into the record;
    the call takes `seconds` of the run's virtual time."""
    id: Any = None
    value: Any = None
    error: BaseException | None = None
    altered: str | None = None
    seconds: float = 0.0


class Application(Protocol):
    """An exercise's instrumented module, harness side. `module` is the name learners import, `stub`
    the learner-side file installed under that name, `functions` the names the stub may call."""
    module: str
    stub: Path
    functions: frozenset[str]

    def decide(self, fn: str, args: tuple[Argument, ...]) -> Decision: ...


class ChannelError(Exception):
    """A request was not well-formed; `args[0]` is what was wrong, as a key of the engine's locales
    under `channel.malformed` (what a malformed call's record keeps as its `error`)."""


@dataclass
class _Connection:
    sock: socket.socket
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)
    closing: bool = False       # the stream cannot be framed any more: close once the outbox is sent
    peer: int | None = None     # the pid that connected, as the kernel says (SO_PEERCRED), not as the learner does


class AppChannel:
    """Serves one learner run: listens on `path` (a unix socket), records calls in `record`. Without an
    `application` (a run whose exercise has no application module) it only keeps the run's clock, and
    any call is malformed."""

    def __init__(self, path: Path, application: Application | None, clock: RunClock | None = None,
                 max_calls: int = MAX_CALLS, max_record_bytes: int = MAX_RECORD_BYTES):
        self.path = Path(path)
        self.application = application
        self.clock = clock or RunClock()
        self.record = CallRecord(max_calls, max_record_bytes)
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def over_limit(self) -> bool:
        return self.record.over_limit

    @property
    def exceeded(self) -> RecordLimit | None:
        """The limit the run went over (calls or bytes of records), for describe_call_limit."""
        return self.record.exceeded

    def calls(self) -> list[Call]:
        return self.record.calls()

    def __enter__(self) -> "AppChannel":
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.path))
            os.chmod(self.path, 0o666)      # the learner's own uid connects
            listener.listen(64)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._serve, name="retrylab-app-channel", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, _Connection):
                key.data.sock.close()
        self._selector.close()
        self._listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        try:
            self.path.unlink()
        except OSError:
            pass

    # the server thread -------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stopping:
            for key, events in self._selector.select(timeout=1.0):
                if key.data == "wake":
                    return
                if key.data is None:
                    self._accept()
                    continue
                connection = key.data
                try:
                    if events & selectors.EVENT_READ:
                        self._read(connection)
                    elif events & selectors.EVENT_WRITE:
                        self._pump(connection)
                except OSError:
                    self._close(connection)
                except Exception:  # noqa: BLE001 - a harness bug must end one connection, not the channel
                    self._close(connection)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        if len(self._selector.get_map()) - 2 >= MAX_CONNECTIONS:
            sock.close()    # the stub says the channel is closed; nothing is recorded
            return
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, _Connection(sock, peer=_peer_pid(sock)))

    def _read(self, connection: _Connection) -> None:
        data = connection.sock.recv(65536)
        if not data:
            if connection.inbox:    # closed in the middle of a frame
                self.record.malformed("unfinished", bytes(connection.inbox[:64]), self.clock)
            self._close(connection)
            return
        connection.inbox += data
        self._pump(connection)

    def _pump(self, connection: _Connection) -> None:
        """Answer the connection's complete requests and send what the socket takes, as long as its
        outbox stays under OUTBOX_CAP; then wait for what lets it go on (readable, or writable)."""
        while True:
            self._answer_frames(connection)
            sent = self._send(connection)
            if not (sent and len(connection.outbox) < OUTBOX_CAP and self._frame_waiting(connection)):
                break       # nothing more to answer, or the socket takes no more for now
        if connection.closing and not connection.outbox:
            self._close(connection)
            return
        wanted = selectors.EVENT_WRITE if connection.outbox else 0
        if not connection.closing and len(connection.outbox) < OUTBOX_CAP:
            wanted |= selectors.EVENT_READ
        self._selector.modify(connection.sock, wanted, connection)

    def _answer_frames(self, connection: _Connection) -> None:
        """Answer the inbox's complete requests while the outbox is under its cap."""
        while len(connection.outbox) < OUTBOX_CAP and self._frame_waiting(connection):
            (length,) = _HEADER.unpack_from(connection.inbox)
            if length > MAX_FRAME:
                self.record.malformed("oversized", bytes(connection.inbox[:64]), self.clock)
                connection.closing = True   # the rest of the stream cannot be framed any more
                connection.inbox.clear()
                self._reply(connection, self._error_reply("ValueError", f"request over {MAX_FRAME} bytes"))
                return
            frame = bytes(connection.inbox[_HEADER.size:_HEADER.size + length])
            del connection.inbox[:_HEADER.size + length]
            self._reply(connection, self._answer(frame, connection.peer))

    @staticmethod
    def _frame_waiting(connection: _Connection) -> bool:
        """The inbox holds a complete request, or a header announcing one over MAX_FRAME."""
        if connection.closing or len(connection.inbox) < _HEADER.size:
            return False
        (length,) = _HEADER.unpack_from(connection.inbox)
        return length > MAX_FRAME or len(connection.inbox) >= _HEADER.size + length

    @staticmethod
    def _reply(connection: _Connection, reply: dict) -> None:
        body = json.dumps(reply, allow_nan=False).encode()
        connection.outbox += _HEADER.pack(len(body)) + body

    @staticmethod
    def _send(connection: _Connection) -> int:
        """Send what the socket takes now (a full socket buffer is no error: the rest waits)."""
        if not connection.outbox:
            return 0
        try:
            sent = connection.sock.send(connection.outbox)
        except BlockingIOError:
            return 0
        del connection.outbox[:sent]
        return sent

    def _close(self, connection: _Connection) -> None:
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()

    # requests ----------------------------------------------------------------------------------

    def _answer(self, frame: bytes, peer: int | None = None) -> dict:
        try:
            request = _decode(frame)
            if request["op"] == "advance":
                return {"offset": self.clock.advance(_seconds(request.get("seconds")))}
            fn, args, pid = _call_of(request, self.application.functions if self.application else frozenset())
        except ChannelError as exc:
            self.record.malformed(str(exc), frame[:64], self.clock)
            return self._error_reply("ValueError", f"retrylab: malformed request to the harness: {exc}")
        if self.record.full:
            self.record.refuse()    # not kept: the run is over its limit, and is being stopped
            return self._refusal()
        return self._call(fn, args, pid, peer)

    def _refusal(self) -> dict:
        limit = self.record.exceeded or RecordLimit(CALLS, self.record.limit)
        over = (f"more than {limit.value} bytes of call records" if limit.kind == BYTES
                else f"more than {limit.value} calls")
        return self._error_reply("RuntimeError", f"retrylab: {over}; this run is being stopped")

    def _call(self, fn: str, args: tuple[Argument, ...], pid: int | None, peer: int | None = None) -> dict:
        t, offset, waited = self.clock.now(), self.clock.offset, _cpu_waited(peer)
        try:
            decision = self.application.decide(fn, args)
        except Exception as exc:  # noqa: BLE001 - a bug in an application must not end the channel
            decision = Decision(error=RuntimeError(f"retrylab: the harness could not decide this call: {exc!r}"))
        first = args[0] if args else None
        error = decision.error
        # the error text is cut once, so that the learner's exception says what the record says
        message = bounded_text(str(error)) if error is not None else None
        recorded = self.record.add(Call(
            t=t, id=bounded_id(decision.id), is_dict=bool(first and first.decoded and isinstance(first.value, dict)),
            arg=first.text[:ARG_TEXT_LIMIT] if first else "", outcome="error" if error else "ok",
            error=message, error_class=type(error).__name__ if error else None,
            offset=offset, pid=pid, fn=fn, altered=decision.altered, cpu_wait=waited, peer=peer))
        if not recorded:    # over the record's budget: refused like a call past the limit
            return self._refusal()
        now = self.clock.advance(decision.seconds)
        if error is not None:
            reply = self._error_reply(type(error).__name__, message, _attributes(error))
            reply["offset"] = now
            return reply
        try:
            json.dumps(decision.value, allow_nan=False)
        except (TypeError, ValueError):
            decision.value = None
        return {"offset": now, "value": decision.value}

    def _error_reply(self, cls: str, message: str, attrs: dict | None = None) -> dict:
        return {"offset": self.clock.offset, "error": {"class": cls, "message": message, "attrs": attrs or {}}}


def bounded_id(message_id):
    """The id a record keeps: as it is up to ID_LIMIT characters; a longer one cut, with its length and
    digest appended. A cut id is longer than ID_LIMIT, so it equals no id kept whole (every seeded id
    is), and two ids cut alike differ by their digests."""
    if not isinstance(message_id, str) or len(message_id) <= ID_LIMIT:
        return message_id
    digest = hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{message_id[:ID_LIMIT]}…[cut: {len(message_id)} characters, sha256 {digest}]"


def bounded_text(text: str, limit: int = ARG_TEXT_LIMIT) -> str:
    """`text` in at most `limit` characters: cut, with a marker saying how long it was."""
    if len(text) <= limit:
        return text
    marker = f"…[cut: {len(text)} characters]"
    return text[:limit - len(marker)] + marker


def _decode(frame: bytes) -> dict:
    try:
        request = json.loads(frame)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ChannelError("not_json") from None
    if not isinstance(request, dict) or request.get("op") not in ("call", "advance"):
        raise ChannelError("not_request")
    return request


def _peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process that connected `sock` (in this process's pid namespace), None if unknown."""
    try:
        pid, _, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except (OSError, AttributeError, struct.error):
        return None
    return pid or None


def _cpu_waited(peer: int | None) -> float | None:
    """How long a busy machine has kept the calling process from a CPU so far (Call.cpu_wait): its threads' waits
    for a CPU, this thread's (which stamps the call's time), and the machine's steal time. None when the kernel
    cannot tell (no peer pid, no schedstat)."""
    learner = procfs.cpu_wait(peer) if peer else None
    if learner is None:
        return None
    return learner + (procfs.own_cpu_wait() or 0.0) + procfs.steal()


def _seconds(value) -> float:
    """A reported sleep's seconds; NaN, infinite or longer than any sleep is malformed (a forged request), and would
    have moved the run's clock out of any date's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -LONGEST_SLEEP < value < LONGEST_SLEEP:
        raise ChannelError("bad_seconds")
    return max(0.0, float(value))


def _call_of(request: dict, functions: frozenset[str]) -> tuple[str, tuple[Argument, ...], int | None]:
    fn, raw_args, pid = request.get("fn"), request.get("args"), request.get("pid")
    if not isinstance(fn, str) or fn not in functions:
        raise ChannelError("unknown_function")
    if not isinstance(raw_args, list) or len(raw_args) > 8:
        raise ChannelError("bad_arguments")
    if not (isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 1 << 32):
        pid = None
    return fn, tuple(_argument(a) for a in raw_args), pid


def _argument(raw) -> Argument:
    if not isinstance(raw, dict) or not isinstance(raw.get("json"), str):
        raise ChannelError("bad_arguments")
    text, type_name = raw["json"], raw.get("type")
    if not isinstance(type_name, str) or not type_name.isidentifier() or len(type_name) > 64:
        type_name = "object"
    truncated = raw.get("truncated") is True
    if not truncated:
        try:
            return Argument(text=text, type_name=type_name, truncated=False, decoded=True, value=json.loads(text))
        except (ValueError, RecursionError):
            pass
    return Argument(text=text, type_name=type_name, truncated=truncated, decoded=False)


def _attributes(error: BaseException) -> dict:
    """An exception's own attributes that survive JSON (HTTPError's status), for the stub to set."""
    found = {}
    for name, value in vars(error).items():
        if not name.startswith("_") and isinstance(value, (str, int, float, bool, type(None))):
            found[name] = value
    return found


def describe_malformed(call: Call) -> str:
    """What was wrong with a malformed call's request, for a learner, in the current language."""
    return i18n.label(f"channel.malformed.{call.error}") if call.outcome == MALFORMED else ""


def describe_call_limit(script: str, limit: RecordLimit | int) -> str:
    """Why a run was stopped for making too many calls (an int: that many), or too many bytes of them,
    in the current language."""
    if isinstance(limit, RecordLimit) and limit.kind == BYTES:
        return i18n.label("channel.byte_limit", script=script, megabytes=f"{limit.value / (1 << 20):g}")
    return i18n.label("channel.call_limit", script=script,
                      limit=limit.value if isinstance(limit, RecordLimit) else limit)
