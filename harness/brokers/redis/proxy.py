"""A recording TCP relay between a learner's Redis clients and the private Redis server of a check.

`RecordingProxy` listens on 127.0.0.1 (a free port), and on a unix socket too if asked (`serve_unix`: the only way out
of a sandbox with its own network namespace), and relays every connection to the upstream server, byte for byte,
in both directions. On the way it parses what clients send (RESP arrays of bulk strings, and inline commands as typed
into telnet) and records every command, so a check can see which values a worker pushed, in which order, from which
connection. It also parses what the server sends back (RESP2 and RESP3) just far enough to count replies, which tells
which commands are still waiting for theirs: `pending()` lists e.g. the BLPOP a worker is blocked in.

Design notes:

* Two daemon threads per connection (client->server and server->client) with plain blocking sockets, plus one accept
  thread. Blocking I/O keeps the added latency to one thread wake-up per hop. At most `max_connections` pairs are open
  at once; a client beyond them is closed at once and counted (`refused`).
* Each direction is parsed *before* its bytes are forwarded. So a command is recorded before the server can act on it
  (seq order respects causality across connections: a command a client sends after seeing the effect of another one
  always gets a higher seq), and a command leaves `pending()` before its client can see the reply.
* The parsers never hold more than one partial header line (bounded by Redis' own 64 KiB inline limit) plus the
  recorded prefix of the argument being read: payload beyond `max_arg_bytes` is counted and skipped, never buffered,
  so a 20 MB value streams through.
* The client stream is followed only where every server splits it into the same commands: length lines must be the
  bare number and CRLF, bulk arguments be followed by CRLF (Redis skips the byte after a '\r' unread, fakeredis reads
  a line up to '\n' and accepts " 64 "; a stream they read differently could run one command while the relay records
  another). Checking this costs next to nothing on the hot path, and then every command an intercepting relay
  forwards is already byte for byte its canonical encoding; re-encoding parsed commands instead would cost a copy of
  every payload (or buffering whole commands) for the same guarantee.
* Parsing problems never affect the relay: a connection whose client stream cannot be parsed stops being recorded, and
  a connection whose reply stream cannot be followed (or is in RESP2 pub/sub mode, MONITOR, CLIENT REPLY OFF/SKIP, ...)
  stops being pending-tracked. Bytes keep flowing unchanged either way.
* An `intercept` (see `Intercept`) may replace a client's command by another one before the server sees it. The
  relay rewrites the byte stream at command boundaries, one command for one, so the server answers every command in
  the order it was sent, in a pipeline and inside MULTI alike: a refusal is an `EVAL` that returns an error reply
  (`refusal`), a made-up answer an `EVAL` that returns it (`time_answer` for TIME). Only commands named in
  `intercept.names` are held back until complete (bounded per command and per relay: see _HOLD_MAX, a longer one is
  refused); all others stream through. With an intercept, a connection whose stream cannot be parsed, or that sends
  an inline command, is closed, never relayed unfiltered (Redis itself closes a connection on a protocol error).
"""
from __future__ import annotations

import collections
import fcntl
import os
import platform
import socket
import struct
import termios
import threading
import time
from dataclasses import dataclass
from typing import Collection, Protocol

__all__ = ["Command", "Intercept", "RecordingProxy", "chain", "refusal", "time_answer"]


@dataclass(frozen=True, slots=True)
class Command:
    seq: int  # global order of arrival across all connections
    conn: int  # connection number, 1, 2, ...
    at: float  # time.time() when the command was fully received
    args: tuple[bytes, ...]  # the command's arguments; each arg truncated to max_arg_bytes
    truncated: bool  # True if any arg was truncated

    @property
    def name(self) -> str:
        return self.args[0].decode("latin-1").upper() if self.args else ""


class Intercept(Protocol):
    """What a RecordingProxy asks about each command named in `names` (upper-case) before the server sees it.

    Called with the command's arguments (each truncated to the proxy's max_arg_bytes) on the connection's relay
    thread; returns None to forward the command as sent, or the arguments of the one command to send instead (e.g.
    `refusal(...)`). Must be quick and must not raise."""

    names: Collection[bytes]

    def __call__(self, args: tuple[bytes, ...]) -> tuple[bytes, ...] | None: ...


class chain:
    """Several intercepts as one (e.g. the admin guard and a virtual clock's TIME): each command goes to those that
    name it, in order; the first rewrite wins."""

    def __init__(self, *intercepts: Intercept):
        self._parts = [(frozenset(n.upper() for n in part.names), part) for part in intercepts]
        self.names = frozenset().union(*(names for names, _ in self._parts))

    def __call__(self, args: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
        name = args[0].upper()
        for names, part in self._parts:
            if name in names:
                rewrite = part(args)
                if rewrite is not None:
                    return rewrite
        return None


def refusal(message: str) -> tuple[bytes, ...]:
    """A command the server answers with the error reply `message` (which the learner's client raises): Redis and
    fakeredis both run it in a pipeline, inside MULTI (the error comes back in EXEC's array) and in RESP2 and RESP3."""
    return (b"EVAL", b"return redis.error_reply(ARGV[1])", b"0", message.encode())


def time_answer(seconds: float) -> tuple[bytes, ...]:
    """A command the server answers exactly as TIME would at `seconds` since the epoch: [seconds, microseconds]."""
    micros = int(round(seconds * 1_000_000))
    return (b"EVAL", b"return {ARGV[1],ARGV[2]}", b"0", str(micros // 1_000_000).encode(),
            str(micros % 1_000_000).encode())


def _encode(args: tuple[bytes, ...]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


# An intercepted command is held back until complete. Those the intercepts want (admin commands, TIME) never need big
# arguments, so one longer than _HOLD_MAX bytes is refused, as soon as the lengths it declares say it will be; and all
# connections of a relay together hold at most _HOLD_BUDGET bytes (a command that would take more is refused too).
_HOLD_MAX = 64 * 1024
_HOLD_BUDGET = 4 << 20
_TOO_LONG = "retrylab: this command is too long for the relay"
MAX_CONNECTIONS = 256  # open at once through one relay (as many as the application channel takes); more are refused

REDACTED = b"(redacted)"


def _redacted(args: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """The command as recorded: a password (AUTH [user] pass, HELLO ... AUTH user pass) never is."""
    name = args[0].upper() if args else b""
    if name == b"AUTH" and len(args) > 1:
        return args[:-1] + (REDACTED,)
    if name == b"HELLO":
        upper = [a.upper() for a in args]
        if b"AUTH" in upper:
            at = upper.index(b"AUTH") + 2   # AUTH username password
            if at < len(args):
                return args[:at] + (REDACTED,) + args[at + 1:]
    return args


def _unread_bytes(sock: socket.socket) -> int | None:
    """Bytes received on `sock` and not yet read (None: cannot tell, e.g. it was closed)."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return None


# Linux syscalls a relay thread waiting for data sits in (read, poll, select, recvfrom, recvmsg, ...)
_READ_SYSCALLS = {"x86_64": {0, 7, 23, 45, 47, 232, 270, 271, 281},
                  "aarch64": {63, 73, 72, 207, 212, 22}}.get(platform.machine())


def _reading(native_id: int | None) -> bool:
    """Whether the thread is blocked in a read (from /proc/self/task/TID/syscall); True where the
    kernel or the architecture cannot say (then unread bytes alone are looked at)."""
    if native_id is None:
        return False
    if _READ_SYSCALLS is None:
        return True
    try:
        with open(f"/proc/self/task/{native_id}/syscall") as f:
            first = f.read().split(maxsplit=1)[0]
    except (OSError, IndexError):
        return True
    return first.isdigit() and int(first) in _READ_SYSCALLS


# --------------------------------------------------------------------------------------------------------------------
# client -> server: commands

_NAME_MAX = 64  # longer than any command's name
_NO_NAME = b"\x00"  # the name of a command whose name is longer than _NAME_MAX
_INLINE_MAX = 64 * 1024  # Redis' PROTO_INLINE_MAX_SIZE: longer header or inline lines are protocol errors
_MULTIBULK_MAX = 2**31 - 1  # Redis rejects a larger argument count
_BULK_MAX = 512 * 1024 * 1024  # Redis' default proto-max-bulk-len

_STAR, _DOLLAR = ord("*"), ord("$")
_C_SPACE = frozenset(b" \t\n\r\x0b\x0c")  # C isspace(): what sdssplitargs skips between arguments
_ESCAPES = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}
_HEX = frozenset(b"0123456789abcdefABCDEF")


def _string2ll(raw: bytes) -> int | None:
    """Redis' string2ll(): an optional '-', then digits with no leading zero (or just "0")."""
    if not raw or len(raw) > 20:
        return None
    if raw == b"0":
        return 0
    digits = raw[1:] if raw[0] == 45 else raw
    if not digits or digits[0] == 48 or not digits.isdigit():
        return None
    return -int(digits) if raw[0] == 45 else int(digits)


_LENGTH_MAX = 20  # characters string2ll() takes: a longer "*<count>" or "$<len>" is a protocol error


def _header_end(data: bytes, pos: int) -> int:
    """Where the "*<count>" or "$<len>" line at `pos` has its '\\r' (the caller reads the number before it), or -1 while
    the line is incomplete.

    Servers cut these lines differently: Redis at the first '\\r', skipping the byte after it unread; fakeredis at the
    first '\\n', then reads the number with int() (spaces, '+', '_' allowed). They agree only on a line that is the
    number itself followed by CRLF, so anything else is confusion, and is declared as soon as it shows (a partial line
    may be streamed upstream while its command is, so it must already be a prefix of a well-formed one)."""
    r = data.find(b"\r", pos + 1, pos + 2 + _LENGTH_MAX)
    if r < 0:
        partial = data[pos + 1:pos + 2 + _LENGTH_MAX]
        digits = partial[1:] if partial[:1] == b"-" else partial
        if len(partial) > _LENGTH_MAX or (digits and not digits.isdigit()):
            raise _ProtocolConfusion("malformed length line")
        return -1
    if r + 1 >= len(data):
        return -1
    if data[r + 1] != 10:
        raise _ProtocolConfusion("'\\r' not followed by '\\n' in a length line")
    return r


def _split_inline(line: bytes) -> list[bytes] | None:
    """Redis' sdssplitargs(): the arguments of an inline command, or None for unbalanced quotes."""
    if b'"' not in line and b"'" not in line and b"\x0b" not in line and b"\x0c" not in line:
        return line.split()  # no quoting: whitespace-separated words, exactly as sdssplitargs splits them
    n = len(line)

    def at(i: int) -> int:
        return line[i] if i < n else 0

    out: list[bytes] = []
    i = 0
    while True:
        while i < n and line[i] in _C_SPACE:
            i += 1
        if i >= n:
            return out
        current = bytearray()
        in_dq = in_sq = done = False
        while not done:
            c = at(i)
            if in_dq:
                if c == 92 and at(i + 1) == 120 and at(i + 2) in _HEX and at(i + 3) in _HEX:  # \xHH
                    current.append(int(line[i + 2:i + 4], 16))
                    i += 3
                elif c == 92 and at(i + 1):
                    i += 1
                    current.append(_ESCAPES.get(line[i], line[i]))
                elif c == 34:  # closing quote: must be followed by a space or the end
                    if at(i + 1) and at(i + 1) not in _C_SPACE:
                        return None
                    done = True
                elif c == 0:
                    return None  # unterminated quotes
                else:
                    current.append(c)
            elif in_sq:
                if c == 92 and at(i + 1) == 39:
                    i += 1
                    current.append(39)
                elif c == 39:
                    if at(i + 1) and at(i + 1) not in _C_SPACE:
                        return None
                    done = True
                elif c == 0:
                    return None
                else:
                    current.append(c)
            elif c in (32, 10, 13, 9, 0):
                done = True
            elif c == 34:
                in_dq = True
            elif c == 39:
                in_sq = True
            else:
                current.append(c)
            if at(i):
                i += 1
        out.append(bytes(current))


def _whole_commands(data: bytes, pos: int, limit: int, out: list, ends: list | None = None, base: int = 0) -> int:
    """The fast path of _CommandParser.feed: parse the plain, complete multibulk commands from `pos` on.

    Returns where it stopped: the end of the data, or the start of a command that is incomplete or unusual in any way
    (the general, byte-exact path then takes it from there). With `ends`, also appends where each command ends
    (`base` + its offset in `data`).
    """
    find = data.find
    n = len(data)
    while pos < n and data[pos] == _STAR:
        r = find(b"\r", pos, pos + 12)  # (a one-byte find is much faster than one for CRLF)
        count = data[pos + 1:r]
        if r < 0 or not count.isdigit() or count[0] == 48 or r + 1 >= n or data[r + 1] != 10:
            return pos  # let the general path deal with it
        p = r + 2
        args = []
        truncated = False
        for _ in range(int(count)):
            r = find(b"\r", p, p + 12)
            length = data[p + 1:r]
            if (r < 0 or data[p] != _DOLLAR or not length.isdigit() or (length[0] == 48 and len(length) > 1)
                    or r + 1 >= n or data[r + 1] != 10):
                return pos
            p = r + 2
            end = p + int(length)
            if end + 2 > n or data[end] != 13 or data[end + 1] != 10:
                return pos
            if end - p > limit:
                truncated = True
                args.append(data[p:p + limit])
            else:
                args.append(data[p:end])
            p = end + 2
        out.append((tuple(args), truncated))
        if ends is not None:
            ends.append(base + p)
        pos = p
    return pos


class _ProtocolConfusion(Exception):
    """The stream does not parse the way the server would parse it: stop following it."""


class _CommandParser:
    """Incremental parser of a client's stream, mirroring how Redis splits it into commands.

    `feed(data, out)` appends the commands completed by `data` to `out` as (args, truncated) pairs. Bulk payloads are
    consumed as they arrive; only their first `max_arg` bytes are kept. Raises _ProtocolConfusion where Redis would
    reply with a protocol error (and close the connection), or would stall, and where servers could split the stream
    differently (a length line other than the number and CRLF, a bulk argument not followed by CRLF; with
    `inline=False`, any inline command); what `out` holds by then stays valid.
    `feed(data, out, ends)` also appends to `ends` the stream offset (bytes fed so far) at which each command ends,
    which lets an intercepting relay cut the stream at command boundaries.
    """

    __slots__ = ("_max", "_inline", "_buf", "_nargs", "_args", "_trunc", "_left", "_crlf", "_part", "_fed")

    def __init__(self, max_arg: int, *, inline: bool = True):
        self._max = max_arg
        self._inline = inline
        self._buf = b""  # unparsed tail: a partial header or inline line
        self._nargs = 0  # arguments still to read for the current multibulk command; 0 = between commands
        self._args: list[bytes] = []
        self._trunc = False
        self._left = -1  # payload bytes of the current bulk argument still to come; -1 = waiting for its header
        self._crlf = 0  # bytes of the CRLF after that payload still to come
        self._part = bytearray()  # kept prefix of a bulk argument that spans reads
        self._fed = 0  # bytes fed so far: the stream offset of the end of the last data

    def current_name(self) -> bytes | None:
        """The upper-cased name of the command under way, b"" when none is, `_NO_NAME` when its name is too long to be
        any command's, None while it is not known yet."""
        if not self._nargs:
            return None if self._buf else b""
        if self._args:
            return self._args[0].upper()
        if self._left > _NAME_MAX or len(self._part) > _NAME_MAX:
            return _NO_NAME
        return None

    def bytes_to_come(self) -> int:
        """A lower bound on the bytes of the command under way not fed yet, from the lengths it declared: what is left
        of the bulk argument being read, and 6 bytes ("$0\\r\\n\\r\\n") for each argument not started."""
        if not self._nargs:
            return 0
        return max(self._left, 0) + self._crlf + 6 * (self._nargs - 1)

    def _add_arg(self, arg: bytes, out: list) -> None:
        self._args.append(arg)
        self._nargs -= 1
        if not self._nargs:
            out.append((tuple(self._args), self._trunc))
            self._args = []
            self._trunc = False

    def feed(self, data: bytes, out: list[tuple[tuple[bytes, ...], bool]], ends: list[int] | None = None) -> None:
        base = self._fed - len(self._buf)  # the stream offset of data[0] once the buffered tail is put back in front
        self._fed += len(data)
        if self._buf:
            data = self._buf + data
            self._buf = b""
        n = len(data)
        pos = 0
        limit = self._max
        while True:
            if not self._nargs:  # between commands: '*' starts a multibulk command, anything else an inline one
                if pos >= n:
                    break
                if data[pos] == _STAR:
                    end = _whole_commands(data, pos, limit, out, ends, base)
                    if end != pos:
                        pos = end
                        continue
                    r = _header_end(data, pos)
                    if r < 0:
                        break
                    count = _string2ll(data[pos + 1:r])
                    if count is None or count > _MULTIBULK_MAX:
                        raise _ProtocolConfusion("invalid multibulk length")
                    pos = r + 2
                    if count > 0:  # "*0" and "*-1" (any negative count, for Redis) are empty commands: no reply
                        self._nargs = count
                        self._left = -1
                    continue
                if not self._inline:
                    raise _ProtocolConfusion("inline command")
                nl = data.find(b"\n", pos)
                if nl < 0:
                    if n - pos > _INLINE_MAX:
                        raise _ProtocolConfusion("inline request too long")
                    break
                line = data[pos:nl]
                pos = nl + 1
                if line.endswith(b"\r"):
                    line = line[:-1]
                if b"\x00" in line:  # Redis scans with strchr(): a NUL hides the newline and the request stalls
                    raise _ProtocolConfusion("NUL in inline request")
                words = _split_inline(line)
                if words is None:
                    raise _ProtocolConfusion("unbalanced quotes in inline request")
                if words:  # an empty line is no command (and gets no reply)
                    truncated = any(len(w) > limit for w in words)
                    if truncated:
                        words = [w[:limit] for w in words]
                    out.append((tuple(words), truncated))
                    if ends is not None:
                        ends.append(base + pos)
                continue

            if self._left < 0:  # waiting for "$<len>\r\n"
                if pos >= n:
                    break
                if data[pos] != _DOLLAR:
                    raise _ProtocolConfusion("expected '$'")
                r = _header_end(data, pos)
                if r < 0:
                    break
                length = _string2ll(data[pos + 1:r])
                if length is None or length < 0 or length > _BULK_MAX:
                    raise _ProtocolConfusion("invalid bulk length")
                pos = r + 2
                if n - pos >= length + 2:  # the whole argument is here (the usual case)
                    if not data.startswith(b"\r\n", pos + length):
                        raise _ProtocolConfusion("no CRLF after a bulk argument")
                    if length > limit:
                        self._trunc = True
                        self._add_arg(data[pos:pos + limit], out)
                    else:
                        self._add_arg(data[pos:pos + length], out)
                    pos += length + 2
                    if ends is not None and not self._nargs:
                        ends.append(base + pos)
                    continue
                if length > limit:
                    self._trunc = True
                self._left = length
                self._crlf = 2
                self._part = bytearray()

            # inside a bulk argument that spans reads
            if self._left:
                take = min(n - pos, self._left)
                room = limit - len(self._part)
                if room > 0:
                    self._part += data[pos:pos + min(take, room)]
                pos += take
                self._left -= take
                if self._left:
                    break
            take = min(n - pos, self._crlf)
            if data[pos:pos + take] != b"\r\n"[2 - self._crlf:2 - self._crlf + take]:
                raise _ProtocolConfusion("no CRLF after a bulk argument")
            pos += take
            self._crlf -= take
            if self._crlf:
                break
            self._left = -1
            part, self._part = self._part, bytearray()
            self._add_arg(bytes(part), out)
            if ends is not None and not self._nargs:
                ends.append(base + pos)
        if pos < n:
            self._buf = data[pos:]


# --------------------------------------------------------------------------------------------------------------------
# server -> client: replies

_LINE_TYPES = frozenset(b"+-:_,#(")  # a value on one line
_BULK_TYPES = frozenset(b"$!=")  # "<len>\r\n" then a payload
_AGG_TYPES = frozenset(b"*~>")  # "<n>\r\n" then n values
_PAIR_TYPES = frozenset(b"%|")  # "<n>\r\n" then n key/value pairs
_PUSH, _ATTR, _ARRAY, _BULK = ord(">"), ord("|"), ord("*"), ord("$")
_HEADER_MAX = 64  # "$<len>" fits in far less


class _ReplyParser:
    """Incremental RESP2 + RESP3 parser that counts complete top-level values in the server's stream.

    `feed(data)` returns (types, values): the first type byte of every complete reply to a command in `data`, in order,
    and the number of complete top-level values, push messages included. An attribute (`|`) is not a value of its own:
    it annotates the value after it. A push message (`>`) is a value but not a reply. Payloads and long lines are
    skipped, never buffered. Raises _ProtocolConfusion on a stream that is not RESP.
    """

    __slots__ = ("_buf", "_skip", "_skip_type", "_line_type", "_cr", "_stack", "_types", "_values")

    def __init__(self):
        self._buf = b""  # partial header line of an aggregate or bulk value
        self._skip = 0  # payload bytes (CRLF included) of a bulk value still to come
        self._skip_type = 0
        self._line_type = 0  # type of a one-line value whose CRLF has not arrived yet
        self._cr = False  # ... and the data so far ended with '\r'
        self._stack: list[list[int]] = []  # open aggregates: [values still to come, type]
        self._types: list[int] = []
        self._values = 0

    def _done(self, kind: int) -> None:
        stack = self._stack
        while stack:
            if kind == _ATTR:
                return  # an attribute does not count as an element of its parent
            top = stack[-1]
            top[0] -= 1
            if top[0]:
                return
            stack.pop()
            kind = top[1]
        if kind == _ATTR:
            return
        self._values += 1
        if kind != _PUSH:
            self._types.append(kind)

    def feed(self, data: bytes) -> tuple[list[int], int]:
        self._types = []
        self._values = 0
        n = len(data)
        pos = 0
        if self._skip:
            if n < self._skip:
                self._skip -= n
                return self._types, 0
            pos = self._skip
            self._skip = 0
            self._done(self._skip_type)
        elif self._line_type:
            if self._cr and n and data[0] == 10:
                pos = 1
            else:
                i = data.find(b"\r\n")
                if i < 0:
                    self._cr = data.endswith(b"\r") or (self._cr and not n)
                    return self._types, 0
                pos = i + 2
            kind, self._line_type, self._cr = self._line_type, 0, False
            self._done(kind)
        elif self._buf:
            data = self._buf + data
            self._buf = b""
            n = len(data)
        while pos < n:
            t = data[pos]
            i = data.find(b"\r\n", pos + 1)
            if t in _LINE_TYPES:
                if i < 0:
                    self._line_type = t
                    self._cr = data.endswith(b"\r") and n - pos > 1
                    break
                pos = i + 2
                self._done(t)
                continue
            if i < 0:
                if n - pos > _HEADER_MAX:
                    raise _ProtocolConfusion("header line too long")
                self._buf = data[pos:]
                break
            if i - pos > _HEADER_MAX:
                raise _ProtocolConfusion("header line too long")
            try:
                length = int(data[pos + 1:i])
            except ValueError:
                raise _ProtocolConfusion("bad length") from None
            pos = i + 2
            if t in _BULK_TYPES:
                if length < 0:
                    if length == -1 and t == _BULK:  # RESP2 null bulk string
                        self._done(t)
                        continue
                    raise _ProtocolConfusion("negative length")
                need = length + 2
                if n - pos >= need:
                    pos += need
                    self._done(t)
                    continue
                self._skip = need - (n - pos)
                self._skip_type = t
                break
            if t in _AGG_TYPES or t in _PAIR_TYPES:
                if length < 0:
                    if length == -1 and t == _ARRAY:  # RESP2 null array
                        self._done(t)
                        continue
                    raise _ProtocolConfusion("negative length")
                count = 2 * length if t in _PAIR_TYPES else length
                if count:
                    self._stack.append([count, t])
                else:
                    self._done(t)
                continue
            raise _ProtocolConfusion(f"unknown type byte {t!r}")
        return self._types, self._values


# --------------------------------------------------------------------------------------------------------------------
# the relay

_RECV = 65536
_CONNECT_TIMEOUT = 5.0
_HALF_CLOSE_GRACE = 2.0  # after a client's EOF, how long the server may take to finish answering and close
_CLOSE_BUDGET = 0.8  # close() joins threads for at most this long in total
_PENDING_CAP = 10_000  # per connection; beyond it, commands awaiting replies are only counted

# Commands that change how replies flow (looked up once per command, upper-cased).
_SUB, _UNSUB, _STREAMING, _CLIENT, _MULTI, _MULTI_END = range(6)
_SPECIAL = {b"SUBSCRIBE": _SUB, b"PSUBSCRIBE": _SUB, b"SSUBSCRIBE": _SUB,
            b"UNSUBSCRIBE": _UNSUB, b"PUNSUBSCRIBE": _UNSUB, b"SUNSUBSCRIBE": _UNSUB,
            b"MONITOR": _STREAMING, b"SYNC": _STREAMING, b"PSYNC": _STREAMING,
            b"CLIENT": _CLIENT, b"MULTI": _MULTI, b"EXEC": _MULTI_END, b"DISCARD": _MULTI_END, b"RESET": _MULTI_END}
_MAP, _SIMPLE = ord("%"), ord("+")


class _Conn:
    __slots__ = ("num", "client", "upstream", "commands", "replies", "pending", "tracking", "proto", "in_multi",
                 "closing", "done", "alive", "threads", "held", "streaming", "oversize")

    def __init__(self, num: int, client: socket.socket, max_arg: int, inline: bool = True):
        self.num = num
        self.client = client
        self.upstream: socket.socket | None = None
        self.commands: _CommandParser | None = _CommandParser(max_arg, inline=inline)  # None once confused
        self.replies: _ReplyParser | None = _ReplyParser()  # None once confused
        self.pending: collections.deque = collections.deque()  # records (see _on_client_data), or int: that many more
        self.tracking = True
        self.proto: int | None = 2  # RESP version; None when unknown
        self.in_multi = False
        self.closing = False
        self.done = threading.Event()
        self.alive = 1  # relay threads still running
        self.threads: list[threading.Thread] = []
        # with an intercept: the bytes of the command under way held back so far, whether that command is being
        # forwarded as it arrives (its name is not intercepted), and whether it grew beyond _HOLD_MAX
        self.held = bytearray()
        self.streaming = False
        self.oversize = False


class RecordingProxy:
    """A TCP relay to `upstream` that records every command clients send through it. See the module docstring."""

    def __init__(self, upstream: tuple[str, int], *, max_arg_bytes: int = 65536, max_commands: int = 200_000,
                 intercept: Intercept | None = None, max_connections: int = MAX_CONNECTIONS):
        if max_arg_bytes < 0 or max_commands < 0 or max_connections < 1:
            raise ValueError("max_arg_bytes and max_commands must not be negative, max_connections must be positive")
        self._intercept = intercept
        self._intercepted = frozenset(n.upper() for n in intercept.names) if intercept is not None else frozenset()
        self._upstream = (upstream[0], int(upstream[1]))
        self._max_arg = max_arg_bytes
        self._max_commands = max_commands
        self._max_connections = max_connections
        self._lock = threading.Lock()
        self._hold_lock = threading.Lock()
        self._held = 0  # bytes all connections hold back (see _HOLD_BUDGET)
        self._commands: list = []  # Command, or its fields as a tuple until a snapshot needs it (cheaper to record)
        self._materialized = 0  # self._commands[:_materialized] are all Command
        self._snapshot_lock = threading.Lock()
        self._conns: dict[int, _Conn] = {}
        self._seq = 0
        self._conn_count = 0
        self._activity = 0
        self.dropped = 0
        self.refused = 0  # connections closed at once because max_connections were open
        self._address: tuple[str, int] | None = None
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._unix_listeners: list[tuple[socket.socket, threading.Thread]] = []
        self._closed = False

    # -- public interface ---------------------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise RuntimeError("RecordingProxy.address is known only after start()")
        return self._address

    @property
    def activity(self) -> int:
        return self._activity

    def start(self) -> RecordingProxy:
        if self._listener is not None or self._closed:
            raise RuntimeError("a RecordingProxy can be started only once")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
            listener.settimeout(0.25)  # a fallback: shutdown() already wakes accept() on Linux
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._address = listener.getsockname()[:2]
        self._accept_thread = threading.Thread(target=self._accept_loop, args=(listener,),
                                               name=f"retrylab-proxy-{self._address[1]}", daemon=True)
        self._accept_thread.start()
        return self

    def serve_unix(self, path) -> None:
        """Also accept clients on a unix socket at `path` (made here, mode 0666: the learner's uid
        connects through it). Its folder should be the harness's, so nobody can replace the socket."""
        if self._listener is None or self._closed:
            raise RuntimeError("serve_unix() needs a started, open RecordingProxy")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(path))
            os.chmod(path, 0o666)
            listener.listen(128)
            listener.settimeout(0.25)
        except OSError:
            listener.close()
            raise
        thread = threading.Thread(target=self._accept_loop, args=(listener,), daemon=True,
                                  name=f"retrylab-proxy-{self._address[1]}-unix")
        with self._lock:
            self._unix_listeners.append((listener, thread))
        thread.start()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._conns.values())
        if self._listener is not None:
            _shutdown(self._listener)  # wakes accept(); the accept thread closes the listener as it leaves
        for listener, _ in self._unix_listeners:
            _shutdown(listener)
        for conn in conns:
            self._end(conn)
        deadline = time.monotonic() + _CLOSE_BUDGET
        threads = [self._accept_thread] if self._accept_thread else []
        threads += [thread for _, thread in self._unix_listeners]
        threads += [t for conn in conns for t in list(conn.threads)]
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        # The relay threads close the sockets as they exit (never close a socket another thread may be blocked on);
        # the shutdowns above have already ended both TCP connections of every pair for the peers.

    def commands(self) -> list[Command]:
        with self._snapshot_lock:  # one snapshot at a time; the relay threads only ever append
            with self._lock:
                start = self._materialized
                raw = self._commands[start:]
            made = [Command(*r) for r in raw]  # outside the relay lock: can be a lot at once
            with self._lock:
                self._commands[start:start + len(made)] = made
                self._materialized = start + len(made)
                return self._commands[:start + len(made)]

    def replies_followed(self) -> bool:
        """Whether every open connection's replies are followed, so that `pending()` tells everything
        the learner waits for (a connection in RESP2 pub/sub mode, say, may wait unseen)."""
        with self._lock:
            return all(conn.tracking for conn in self._conns.values() if not conn.closing)

    def replies_in_flight(self) -> bool:
        """Whether a reply to a pending command may already be on its way through the relay: bytes
        wait unread on its server socket, or the thread that relays them is not blocked reading
        (it has read a reply and not yet parsed it: on a busy machine it may wait long for the GIL or
        a CPU). Only when this is False does `pending()` mean the server has not answered."""
        with self._lock:
            conns = [c for c in self._conns.values()
                     if c.tracking and any(type(r) is tuple for r in c.pending)]
        for conn in conns:
            upstream = conn.upstream
            relay = next((t for t in list(conn.threads) if t.name.endswith("-out")), None)
            if upstream is None or relay is None or _unread_bytes(upstream) != 0 or not _reading(relay.native_id):
                return True
        return False

    def pending(self) -> list[Command]:
        with self._lock:
            raw = [r for conn in self._conns.values() if conn.tracking for r in conn.pending if type(r) is tuple]
        raw.sort()
        return [Command(*r) for r in raw]

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<RecordingProxy {self._address} -> {self._upstream} commands={len(self._commands)} "
                f"dropped={self.dropped} connections={len(self._conns)} refused={self.refused}>")

    # -- connections --------------------------------------------------------------------------------------------------

    def _accept_loop(self, listener: socket.socket) -> None:
        try:
            while not self._closed:
                try:
                    client, _ = listener.accept()
                except socket.timeout:
                    continue
                except OSError:
                    if self._closed:
                        return
                    time.sleep(0.05)  # e.g. out of file descriptors: don't spin
                    continue
                with self._lock:
                    if self._closed:
                        client.close()
                        return
                    full = len(self._conns) >= self._max_connections
                    if full:
                        self.refused += 1
                    else:
                        self._conn_count += 1
                        # With an intercept, inline commands (as typed into telnet) close the connection: no client
                        # library sends them (redis-py never does), fakeredis does not take them at all, and Redis
                        # splits them by a second grammar (quotes, escapes, bare LF) that a guard would have to mirror
                        # byte for byte, or be passed by whatever the two read differently.
                        conn = _Conn(self._conn_count, client, self._max_arg, inline=self._intercept is None)
                        self._conns[conn.num] = conn
                if full:  # every connection costs two threads and an upstream one: a flood of them is refused
                    client.close()
                    continue
                client.setblocking(True)
                _nodelay(client)
                thread = threading.Thread(target=self._client_to_server, args=(conn,), daemon=True,
                                          name=f"retrylab-proxy-{self._address[1]}-c{conn.num}-in")
                conn.threads.append(thread)
                try:
                    thread.start()
                except RuntimeError:  # can't start a thread: refuse this client
                    with self._lock:
                        self._conns.pop(conn.num, None)
                    client.close()
        finally:
            listener.close()

    def _end(self, conn: _Conn) -> None:
        """Close the pair: wake both relay threads (the last one to exit closes the sockets). Idempotent."""
        with self._lock:
            conn.closing = True
            conn.tracking = False
            conn.pending.clear()
            upstream = conn.upstream
        _shutdown(conn.client)
        if upstream is not None:
            _shutdown(upstream)
        conn.done.set()

    def _thread_exit(self, conn: _Conn) -> None:
        self._end(conn)
        with self._lock:
            conn.alive -= 1
            last = conn.alive == 0
            if last and self._conns.get(conn.num) is conn:
                del self._conns[conn.num]
        if last:
            conn.client.close()
            if conn.upstream is not None:
                conn.upstream.close()

    def _client_to_server(self, conn: _Conn) -> None:
        try:
            try:
                upstream = socket.create_connection(self._upstream, timeout=_CONNECT_TIMEOUT)
            except OSError:
                return  # the finally clause closes the client socket
            upstream.settimeout(None)
            _nodelay(upstream)
            with self._lock:
                if conn.closing:
                    upstream.close()
                    return
                conn.upstream = upstream
                conn.alive += 1
            thread = threading.Thread(target=self._server_to_client, args=(conn,), daemon=True,
                                      name=f"retrylab-proxy-{self._address[1]}-c{conn.num}-out")
            conn.threads.append(thread)
            try:
                thread.start()
            except RuntimeError:  # can't start a thread: give up on this pair
                with self._lock:
                    conn.alive -= 1
                return
            client = conn.client
            while True:
                try:
                    data = client.recv(_RECV)
                except OSError:
                    return
                if not data:
                    break
                if self._intercept is not None:
                    data = self._filter(conn, data)
                    if conn.commands is None:  # lost track of the stream: stop reading it, as Redis would
                        try:
                            upstream.sendall(data)
                        except OSError:
                            return
                        break  # the server answers what it got, then the pair closes (as on the client's EOF)
                    if not data:
                        continue
                elif conn.commands is not None:
                    self._on_client_data(conn, data)
                try:
                    upstream.sendall(data)
                except OSError:
                    return
            # The client closed (or half-closed) its side: pass that on, let the server answer what it has received
            # and close, which ends the pair from the other thread. Force it after a grace period.
            try:
                upstream.shutdown(socket.SHUT_WR)
            except OSError:
                return
            conn.done.wait(_HALF_CLOSE_GRACE)
        finally:
            self._let_go(conn)  # only this thread touches conn.held
            self._thread_exit(conn)

    def _server_to_client(self, conn: _Conn) -> None:
        try:
            upstream, client = conn.upstream, conn.client
            while True:
                try:
                    data = upstream.recv(_RECV)
                except OSError:
                    return
                if not data:
                    return
                self._on_server_data(conn, data)
                try:
                    client.sendall(data)
                except OSError:
                    return
        finally:
            self._thread_exit(conn)

    # -- recording ----------------------------------------------------------------------------------------------------

    def _on_client_data(self, conn: _Conn, data: bytes) -> None:
        parsed: list[tuple[tuple[bytes, ...], bool]] = []
        try:
            conn.commands.feed(data, parsed)
            confused = False
        except Exception:  # _ProtocolConfusion, or a bug: never let it reach the relay
            confused = True
        if not parsed and not confused:
            return
        self._record(conn, parsed, confused)

    def _filter(self, conn: _Conn, data: bytes) -> bytes:
        """Record the commands in `data` and return the bytes to send upstream in its place: intercepted commands
        rewritten, the command under way held back while it may still be. Sets conn.commands to None when the stream
        stops parsing (the caller then sends what is returned and closes the pair)."""
        parser = conn.commands
        parsed: list[tuple[tuple[bytes, ...], bool]] = []
        ends: list[int] = []
        try:
            parser.feed(data, parsed, ends)
            confused = False
        except Exception:
            confused = True
        start = parser._fed - len(data)  # the stream offset of data[0]
        out = bytearray()
        sent: list[tuple[bytes, ...]] = []
        pos = 0
        for (args, _), end in zip(parsed, ends):
            stop = end - start
            rewrite = None
            if not conn.streaming and args[0].upper() in self._intercepted:
                too_long = conn.oversize or len(conn.held) + stop - pos > _HOLD_MAX
                rewrite = refusal(_TOO_LONG) if too_long else self._ask(args)
            if rewrite is None:
                out += conn.held
                out += data[pos:stop]
            else:
                out += _encode(rewrite)
            sent.append(rewrite or args)
            self._let_go(conn)
            conn.streaming = conn.oversize = False
            pos = stop
        tail = data[pos:]
        if tail and not confused:
            name = parser.current_name() if not conn.streaming else _NO_NAME
            if name is not None and name not in self._intercepted:
                out += conn.held
                out += tail
                self._let_go(conn)
                conn.streaming = bool(name)
            elif name is None:  # its name is still to come: a few short lines at most, held whatever the budget
                self._hold(conn, tail, bounded=False)
            elif not conn.oversize:  # intercepted
                if (len(conn.held) + len(tail) + parser.bytes_to_come() > _HOLD_MAX
                        or not self._hold(conn, tail, bounded=True)):
                    self._let_go(conn)  # its bytes are dropped as they come; the refusal goes in its place
                    conn.oversize = True
        if parsed or confused:
            self._record(conn, parsed, confused, sent)
        return bytes(out)

    def _hold(self, conn: _Conn, data: bytes, bounded: bool) -> bool:
        """Add `data` to what `conn` holds back, if `bounded` only while the relay's budget allows."""
        with self._hold_lock:
            if bounded and self._held + len(data) > _HOLD_BUDGET:
                return False
            self._held += len(data)
        conn.held += data
        return True

    def _let_go(self, conn: _Conn) -> None:
        """Forget what `conn` holds back (sent on, replaced or dropped), and give it back to the budget."""
        if conn.held:
            with self._hold_lock:
                self._held -= len(conn.held)
            conn.held.clear()

    def _ask(self, args: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
        try:
            return self._intercept(args)
        except Exception:  # a broken intercept must not open the gate it guards
            return refusal("retrylab: the relay could not judge this command")

    def _record(self, conn: _Conn, parsed: list, confused: bool, sent: list | None = None) -> None:
        """Record parsed commands; `sent` holds what was sent upstream for each, when an intercept rewrote any."""
        now = time.time()
        num = conn.num
        with self._lock:
            commands = self._commands
            for i, (args, truncated) in enumerate(parsed):
                self._seq += 1
                record = (self._seq, num, now, _redacted(args), truncated)  # a Command's fields
                if len(commands) < self._max_commands:
                    commands.append(record)
                else:
                    self.dropped += 1
                if conn.tracking:
                    self._track(conn, record, sent[i] if sent else args)
            self._activity += len(parsed)
            if confused:
                conn.commands = None
                self._untrack(conn)

    def _track(self, conn: _Conn, record: tuple, args: tuple[bytes, ...]) -> None:
        """Note that `record` awaits a reply (called with the lock held, before the server can see the command);
        `args` is the command as the server gets it (an intercept may have rewritten it)."""
        special = _SPECIAL.get(args[0].upper())
        if special is None:
            pass
        elif special == _SUB or special == _UNSUB:
            # RESP2: in pub/sub mode messages are arrays, indistinguishable from replies. RESP3: (un)subscribe
            # confirmations are push messages, so these commands get no reply of their own, unless SUBSCRIBE lacks a
            # channel (an error).
            if conn.proto != 3 or conn.in_multi:
                self._untrack(conn)
                return
            if special == _UNSUB or len(args) > 1:
                return
        elif special == _STREAMING:
            self._untrack(conn)
            return
        elif special == _CLIENT:
            if len(args) > 2 and args[1].upper() == b"REPLY" and args[2].upper() != b"ON":
                self._untrack(conn)  # OFF / SKIP: replies go missing
                return
        elif special == _MULTI:
            conn.in_multi = True
        else:
            conn.in_multi = False
        pending = conn.pending
        if len(pending) < _PENDING_CAP:
            pending.append(record)
        elif isinstance(pending[-1], int):
            pending[-1] += 1
        else:
            pending.append(1)

    def _untrack(self, conn: _Conn) -> None:
        conn.tracking = False
        conn.pending.clear()

    def _on_server_data(self, conn: _Conn, data: bytes) -> None:
        parser = conn.replies
        if parser is None:
            with self._lock:
                self._activity += 1
            return
        try:
            types, values = parser.feed(data)
            confused = False
        except Exception:
            types, values, confused = parser._types, parser._values, True
        if not values and not confused:
            return
        with self._lock:
            self._activity += values or 1
            if conn.tracking:
                pending = conn.pending
                for kind in types:
                    if not pending:
                        self._untrack(conn)  # a reply nobody asked for: we lost track
                        break
                    head = pending[0]
                    if isinstance(head, int):
                        if head > 1:
                            pending[0] = head - 1
                        else:
                            pending.popleft()
                        continue
                    pending.popleft()
                    name = head[3][0].upper()
                    if name == b"HELLO":
                        if kind == _MAP:
                            conn.proto = 3
                        elif kind == _ARRAY:
                            conn.proto = 2
                        elif kind == _SIMPLE:  # +QUEUED: takes effect at EXEC, with whichever version it asked for
                            conn.proto = None
                    elif name == b"RESET" and kind == _SIMPLE:
                        conn.proto = 2
            if confused:
                conn.replies = None
                self._untrack(conn)


def _nodelay(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
