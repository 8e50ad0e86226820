"""RESP, as the relay follows it: a client's stream split into commands exactly as Redis splits it
(`CommandParser`), and a server's stream (RESP2 and RESP3) counted in replies (`ReplyParser`).

Both are incremental and bounded: they never hold more than one partial header line (Redis' own 64 KiB
inline limit) plus the recorded prefix of the argument being read; payload beyond what is recorded is
counted and skipped, never buffered. See retrylab.brokers.redis.proxy for why the client stream is
followed only where every server splits it alike."""
from __future__ import annotations

# client -> server: commands

_NAME_MAX = 64  # longer than any command's name
NO_NAME = b"\x00"  # the name of a command whose name is longer than _NAME_MAX
_INLINE_MAX = 64 * 1024  # Redis' PROTO_INLINE_MAX_SIZE: longer header or inline lines are protocol errors
_MULTIBULK_MAX = 2**31 - 1  # Redis rejects a larger argument count
_BULK_MAX = 512 * 1024 * 1024  # Redis' default proto-max-bulk-len

_STAR, _DOLLAR = ord("*"), ord("$")
_C_SPACE = frozenset(b" \t\n\r\x0b\x0c")  # C isspace(): what sdssplitargs skips between arguments
_ESCAPES = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}
_HEX = frozenset(b"0123456789abcdefABCDEF")


def string2ll(raw: bytes) -> int | None:
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
            raise ProtocolConfusion("malformed length line")
        return -1
    if r + 1 >= len(data):
        return -1
    if data[r + 1] != 10:
        raise ProtocolConfusion("'\\r' not followed by '\\n' in a length line")
    return r


def split_inline(line: bytes) -> list[bytes] | None:
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
    """The fast path of CommandParser.feed: parse the plain, complete multibulk commands from `pos` on.

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


class ProtocolConfusion(Exception):
    """The stream does not parse the way the server would parse it: stop following it."""


class CommandParser:
    """Incremental parser of a client's stream, mirroring how Redis splits it into commands.

    `feed(data, out)` appends the commands completed by `data` to `out` as (args, truncated) pairs. Bulk payloads are
    consumed as they arrive; only their first `max_arg` bytes are kept. Raises ProtocolConfusion where Redis would
    reply with a protocol error (and close the connection), or would stall, and where servers could split the stream
    differently (a length line other than the number and CRLF, a bulk argument not followed by CRLF; with
    `inline=False`, any inline command); what `out` holds by then stays valid.
    `feed(data, out, ends)` also appends to `ends` the stream offset (bytes fed so far) at which each command ends,
    which lets an intercepting relay cut the stream at command boundaries.
    """

    __slots__ = ("_max", "_inline", "_buf", "_nargs", "_args", "_trunc", "_left", "_crlf", "_part", "fed")

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
        self.fed = 0  # bytes fed so far: the stream offset of the end of the last data

    def current_name(self) -> bytes | None:
        """The upper-cased name of the command under way, b"" when none is, `NO_NAME` when its name is too long to be
        any command's, None while it is not known yet."""
        if not self._nargs:
            return None if self._buf else b""
        if self._args:
            return self._args[0].upper()
        if self._left > _NAME_MAX or len(self._part) > _NAME_MAX:
            return NO_NAME
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
        base = self.fed - len(self._buf)  # the stream offset of data[0] once the buffered tail is put back in front
        self.fed += len(data)
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
                    count = string2ll(data[pos + 1:r])
                    if count is None or count > _MULTIBULK_MAX:
                        raise ProtocolConfusion("invalid multibulk length")
                    pos = r + 2
                    if count > 0:  # "*0" and "*-1" (any negative count, for Redis) are empty commands: no reply
                        self._nargs = count
                        self._left = -1
                    continue
                if not self._inline:
                    raise ProtocolConfusion("inline command")
                nl = data.find(b"\n", pos)
                if nl < 0:
                    if n - pos > _INLINE_MAX:
                        raise ProtocolConfusion("inline request too long")
                    break
                line = data[pos:nl]
                pos = nl + 1
                if line.endswith(b"\r"):
                    line = line[:-1]
                if b"\x00" in line:  # Redis scans with strchr(): a NUL hides the newline and the request stalls
                    raise ProtocolConfusion("NUL in inline request")
                words = split_inline(line)
                if words is None:
                    raise ProtocolConfusion("unbalanced quotes in inline request")
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
                    raise ProtocolConfusion("expected '$'")
                r = _header_end(data, pos)
                if r < 0:
                    break
                length = string2ll(data[pos + 1:r])
                if length is None or length < 0 or length > _BULK_MAX:
                    raise ProtocolConfusion("invalid bulk length")
                pos = r + 2
                if n - pos >= length + 2:  # the whole argument is here (the usual case)
                    if not data.startswith(b"\r\n", pos + length):
                        raise ProtocolConfusion("no CRLF after a bulk argument")
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
                raise ProtocolConfusion("no CRLF after a bulk argument")
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


class ReplyParser:
    """Incremental RESP2 + RESP3 parser that counts complete top-level values in the server's stream.

    `feed(data)` returns (types, values): the first type byte of every complete reply to a command in `data`, in order,
    and the number of complete top-level values, push messages included. An attribute (`|`) is not a value of its own:
    it annotates the value after it. A push message (`>`) is a value but not a reply. Payloads and long lines are
    skipped, never buffered. Raises ProtocolConfusion on a stream that is not RESP.
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
                    raise ProtocolConfusion("header line too long")
                self._buf = data[pos:]
                break
            if i - pos > _HEADER_MAX:
                raise ProtocolConfusion("header line too long")
            try:
                length = int(data[pos + 1:i])
            except ValueError:
                raise ProtocolConfusion("bad length") from None
            pos = i + 2
            if t in _BULK_TYPES:
                if length < 0:
                    if length == -1 and t == _BULK:  # RESP2 null bulk string
                        self._done(t)
                        continue
                    raise ProtocolConfusion("negative length")
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
                    raise ProtocolConfusion("negative length")
                count = 2 * length if t in _PAIR_TYPES else length
                if count:
                    self._stack.append([count, t])
                else:
                    self._done(t)
                continue
            raise ProtocolConfusion(f"unknown type byte {t!r}")
        return self._types, self._values


# --------------------------------------------------------------------------------------------------------------------
