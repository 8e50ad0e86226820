"""Following a NATS connection's byte stream, op by op, without holding its payloads.

NATS' text protocol frames every op as one control line (`PUB subject [reply] size`, `HPUB subject [reply]
header-size total-size`, `MSG subject sid [reply] size`, `HMSG ...`, `SUB`, `UNSUB`, `CONNECT {json}`,
`INFO {json}`, `PING`, `PONG`, `+OK`, `-ERR '...'`), the payload ops followed by exactly that many bytes and
CRLF. `Framer` reads one direction: it holds at most one partial control line (bounded by `line_limit`) and
the first `keep` bytes of the payload under way; the rest of a payload is counted and skipped, so a 1 MB
message streams through. A stream it cannot follow (a line beyond the limit, a bad size, a payload not
ended by CRLF: nats-server closes such a connection) leaves it `confused`: it then reads nothing more.

With `rewrite`, the framer is also a filter: `feed` returns the bytes to pass on, every control line
handed to `rewrite(op, line)` once complete (it returns the line to send in its place), payloads as they
come. Without, `feed` returns None: the caller passes the bytes on unchanged.
"""
from __future__ import annotations

from typing import Callable

LINE_LIMIT = 64 * 1024      # nats-server's own limit is 4 KiB for most ops; a CONNECT with a JWT is longer
# ops whose control line is followed by a payload: where, among the line's fields, its sizes are
_PAYLOAD_OPS = {"PUB": 1, "HPUB": 2, "MSG": 1, "HMSG": 2}
_JSON_OPS = {"CONNECT", "INFO", "-ERR"}     # the rest of the line is one argument, spaces and all

# on_op(op, fields, size, header_size, kept): `fields` the line's words after the op (bytes; for
# CONNECT, INFO and -ERR one field, the rest of the line), `size` the payload's total bytes (headers
# included), `header_size` those of its header block, `kept` its first bytes (at most `keep`).
OnOp = Callable[[str, list, int, int, bytes], None]


class Confused(ValueError):
    """The stream is not NATS protocol as nats-server reads it."""


class Framer:
    __slots__ = ("_on_op", "_keep", "_line_limit", "_rewrite", "_line", "_op", "_left", "_end", "_kept",
                 "_at", "confused")

    def __init__(self, on_op: OnOp, *, keep: int = 4096, line_limit: int = LINE_LIMIT,
                 rewrite: Callable[[str, bytes], bytes] | None = None):
        self._on_op = on_op
        self._keep = keep
        self._line_limit = line_limit
        self._rewrite = rewrite
        self._line = bytearray()
        self._op: tuple | None = None   # the payload op under way: (op, fields, size, header_size)
        self._left = 0                  # its payload bytes still to come
        self._end = 0                   # of its closing CRLF, bytes already seen (0-2)
        self._kept = bytearray()
        self._at = 0                    # of the bytes being fed, how many are dealt with
        self.confused = False

    def feed(self, data: bytes) -> bytes | None:
        out = bytearray() if self._rewrite is not None else None
        if self.confused:
            if out is not None:
                out += data
            return out
        self._at = 0
        try:
            self._feed(bytes(data), out)
        except Confused:
            self.confused = True
            if out is not None:     # from here on bytes pass as they are: the line held, and the rest
                out += self._line
                out += data[self._at:]
            self._line.clear()
            self._kept.clear()
        return out

    def _feed(self, raw: bytes, out: bytearray | None) -> None:
        data = memoryview(raw)
        i, n = 0, len(raw)
        while i < n:
            if self._op is not None:
                i = self._at = self._payload(data, i, out)
                continue
            j = raw.find(b"\n", i)
            if j < 0:
                if len(self._line) + n - i > self._line_limit:
                    raise Confused("control line too long")
                self._line += data[i:]
                self._at = n
                return
            self._line += data[i:j + 1]
            i = self._at = j + 1
            if len(self._line) > self._line_limit:
                raise Confused("control line too long")
            op = self._control(bytes(self._line))
            line = bytes(self._line)
            self._line.clear()
            if out is not None:
                out += self._rewrite(op, line) if op else line

    def _control(self, line: bytes) -> str:
        text = line.rstrip(b"\r\n")
        head, _, rest = text.lstrip(b" \t").partition(b" ")
        if not head:
            return ""
        if b"\t" in head:
            head, _, more = head.partition(b"\t")
            rest = more + b" " + rest if rest else more
        op = head.decode("latin-1").upper()
        if op in _JSON_OPS:
            self._on_op(op, [rest.strip(b" \t")], 0, 0, b"")
            return op
        fields = rest.split()
        sizes = _PAYLOAD_OPS.get(op)
        if sizes is None:
            self._on_op(op, fields, 0, 0, b"")
            return op
        if len(fields) < sizes + 1:
            raise Confused(f"{op} without its sizes")
        try:
            numbers = [int(f) for f in fields[-sizes:]]
        except ValueError:
            raise Confused(f"{op} with a size that is no number") from None
        size, header_size = numbers[-1], (numbers[0] if sizes == 2 else 0)
        if size < 0 or not 0 <= header_size <= size:
            raise Confused(f"{op} with impossible sizes")
        self._op, self._left, self._end = (op, fields[:-sizes], size, header_size), size, 0
        return op

    def _payload(self, data: memoryview, i: int, out: bytearray | None) -> int:
        n = len(data)
        if self._left:
            take = min(self._left, n - i)
            room = self._keep - len(self._kept)
            if room > 0:
                self._kept += data[i:i + min(room, take)]
            if out is not None:
                out += data[i:i + take]
            self._left -= take
            i += take
        while self._left == 0 and self._end < 2 and i < n:
            if data[i] != b"\r\n"[self._end]:
                self._at = i        # what came before went out already
                raise Confused("a payload not ended by CRLF")
            if out is not None:
                out += data[i:i + 1]
            self._end += 1
            i += 1
        if self._left == 0 and self._end == 2:
            op, fields, size, header_size = self._op
            kept = bytes(self._kept)
            self._op = None
            self._kept.clear()
            self._on_op(op, fields, size, header_size, kept)
        return i

