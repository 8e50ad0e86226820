"""A recording relay between a learner's NATS clients and the private nats-server of a check.

`RecordingRelay` listens on 127.0.0.1 (a free port), and on a unix socket too if asked (`serve_unix`: the
only way out of a sandbox with its own network namespace), and relays every connection to the server, in
both directions, reading each with a `protocol.Framer` on the way:

* what the learner sends is recorded before the server gets it (`commands()`: PUB and HPUB with subject,
  reply, sizes, header block and the first bytes of the payload; SUB, UNSUB, CONNECT without its
  credentials), so a record's seq respects causality across connections;
* what the server delivers is recorded too (`deliveries()`: MSG and HMSG, e.g. JetStream deliveries with
  their `$JS.ACK...` reply subjects, and -ERR);
* the server's INFO reaches the learner with the relay's own address in place of the server's and without
  `connect_urls` (nor `ws_connect_urls`): a client must not learn, and reconnect to, the real address.

Memory stays bounded whatever the learner sends: at most `max_records` records each way (more are only
counted: `dropped`), at most `keep` payload bytes per record and `max_kept_bytes` in all (beyond, records
keep no payload: `truncated`), one partial control line per connection (the framer's limit), and at most
`max_connections` connections at once (more are closed at once and counted: `refused`). Bytes are never
held back beyond one control line: a payload streams through as it comes.

Two daemon threads per connection (learner->server, server->learner) with plain blocking sockets, and one
accept thread per listener: as the Redis relay (retrylab.brokers.redis.proxy) does, for the same reasons.
"""
from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from dataclasses import dataclass

from retrylab.background import join_all
from retrylab.brokers.nats.protocol import Framer

__all__ = ["Frame", "KEEP", "MAX_CONNECTIONS", "MAX_KEPT_BYTES", "MAX_RECORDS", "RecordingRelay"]

MAX_CONNECTIONS = 256
MAX_RECORDS = 50_000        # records kept each way (learner ops, deliveries) per relay, i.e. per learner run
MAX_KEPT_BYTES = 8 << 20    # payload bytes kept in all those records
KEEP = 4096                 # payload bytes kept per record
_RECV = 65536
_CONNECT_TIMEOUT = 5.0
_CLOSE_BUDGET = 0.8         # close() joins threads for at most this long in total
_HIDDEN_INFO = ("connect_urls", "ws_connect_urls", "leafnode_urls")
_LEARNER_OPS = frozenset({"PUB", "HPUB", "SUB", "UNSUB", "CONNECT"})
_SERVER_OPS = frozenset({"MSG", "HMSG", "-ERR"})


@dataclass(frozen=True, slots=True)
class Frame:
    """One protocol op that crossed the relay."""
    seq: int                # order across every connection and both directions
    conn: int               # which connection (numbered from 1 as they came)
    at: float               # time.time() when the relay read it
    op: str                 # PUB, HPUB, SUB, UNSUB, CONNECT (the learner's); MSG, HMSG, -ERR (the server's)
    subject: str = ""       # -ERR: its text
    reply: str = ""         # PUB/HPUB/MSG/HMSG: the reply subject
    sid: str = ""           # SUB/UNSUB/MSG/HMSG
    queue: str = ""         # SUB: the queue group
    size: int = 0           # payload bytes, header block included
    headers: bytes = b""    # HPUB/HMSG: the header block (as much of it as was kept)
    data: bytes = b""       # the payload after the headers (as much of it as was kept)
    truncated: bool = False  # the payload is longer than what was kept


class _Conn:
    __slots__ = ("num", "client", "upstream", "alive", "threads", "ended", "read_all")

    def __init__(self, num: int, client: socket.socket):
        self.num = num
        self.client = client
        self.upstream: socket.socket | None = None
        self.alive = 0                  # pump threads still running (the last closes both sockets)
        self.threads: list[threading.Thread] = []
        self.ended = False
        self.read_all = False           # the learner's side is read to its end (or the pair ended)


class RecordingRelay:
    """See the module's text. Start it (`start()` or `with`), then read `address`."""

    def __init__(self, upstream: tuple[str, int], *, keep: int | None = None, max_records: int | None = None,
                 max_kept_bytes: int | None = None, max_connections: int | None = None):
        self._upstream = (upstream[0], int(upstream[1]))
        # the module's limits as they are when the relay is made (tests lower them)
        self._keep = KEEP if keep is None else keep
        self._max_records = MAX_RECORDS if max_records is None else max_records
        self._max_kept = MAX_KEPT_BYTES if max_kept_bytes is None else max_kept_bytes
        self._max_connections = MAX_CONNECTIONS if max_connections is None else max_connections
        self._lock = threading.Lock()
        self._sent: list[Frame] = []
        self._delivered: list[Frame] = []
        self._kept = 0
        self._seq = 0
        self._conn_count = 0
        self._conns: dict[int, _Conn] = {}
        self.learner_ops = 0            # every op the learner sent, PING and PONG included, recorded or not
        self.activity = 0               # every op either way
        self.dropped = 0
        self.refused = 0
        self._address: tuple[str, int] | None = None
        self._listeners: list[tuple[socket.socket, threading.Thread]] = []
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise RuntimeError("RecordingRelay.address is known only after start()")
        return self._address

    def start(self) -> RecordingRelay:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
            listener.settimeout(0.25)   # a fallback: shutdown() wakes accept() on Linux
        except OSError:
            listener.close()
            raise
        self._address = listener.getsockname()[:2]
        self._listen(listener, "tcp")
        return self

    def serve_unix(self, path) -> None:
        """Also accept clients on a unix socket at `path` (made here, mode 0666: the learner's uid connects
        through it). Its folder should be the harness's, so that nobody can replace the socket."""
        if self._address is None or self._closed:
            raise RuntimeError("serve_unix() needs a started, open RecordingRelay")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(path))
            os.chmod(path, 0o666)
            listener.listen(128)
            listener.settimeout(0.25)
        except OSError:
            listener.close()
            raise
        self._listen(listener, "unix")

    def _listen(self, listener: socket.socket, kind: str) -> None:
        thread = threading.Thread(target=self._accept_loop, args=(listener,), daemon=True,
                                  name=f"retrylab-nats-relay-{self._address[1]}-{kind}")
        with self._lock:
            self._listeners.append((listener, thread))
        thread.start()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._conns.values())
            listeners = list(self._listeners)
        for listener, _ in listeners:
            if listener.family == socket.AF_UNIX:
                _wake(listener)     # shutdown() does not wake accept() on a unix socket: a connection does
            _shutdown(listener)
        for conn in conns:
            self._end(conn)
        join_all([thread for _, thread in listeners] + [t for conn in conns for t in list(conn.threads)], _CLOSE_BUDGET)

    def __enter__(self) -> RecordingRelay:
        return self.start() if self._address is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what was recorded -------------------------------------------------------------------------
    def commands(self) -> list[Frame]:
        """What learners sent, in order (PUB, HPUB, SUB, UNSUB, CONNECT)."""
        with self._lock:
            return list(self._sent)

    def deliveries(self) -> list[Frame]:
        """What the server sent learners, in order (MSG, HMSG, -ERR)."""
        with self._lock:
            return list(self._delivered)

    @property
    def kept_bytes(self) -> int:
        """Payload bytes the records hold (at most max_kept_bytes)."""
        return self._kept

    def drain_closed(self, timeout: float = 1.0) -> None:
        """Wait (at most `timeout`) until what learners sent on connections they have closed is read and
        recorded. A learner's last publishes (an ack, say) may still sit unread in the relay's socket when
        its process has exited: read now, they would be missing from the record. Connections still open
        on the learner's side are not waited for."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                conns = [c for c in self._conns.values() if not c.read_all]
            if not any(_peer_closed(c.client) for c in conns):
                return
            time.sleep(0.002)

    def connections(self) -> int:
        """Connections accepted so far (refused ones not counted)."""
        return self._conn_count

    # -- connections -------------------------------------------------------------------------------
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
                    time.sleep(0.05)    # out of file descriptors, say: try again
                    continue
                self._open(client)
        finally:
            listener.close()

    def _open(self, client: socket.socket) -> None:
        with self._lock:
            if self._closed or len(self._conns) >= self._max_connections:
                self.refused += 0 if self._closed else 1
                client.close()
                return
            self._conn_count += 1
            conn = _Conn(self._conn_count, client)
            self._conns[conn.num] = conn
            conn.alive = 1
        client.settimeout(None)
        _nodelay(client)
        thread = threading.Thread(target=self._learner_to_server, args=(conn,), daemon=True,
                                  name=f"retrylab-nats-relay-{conn.num}-in")
        conn.threads.append(thread)
        thread.start()

    def _learner_to_server(self, conn: _Conn) -> None:
        try:
            try:
                upstream = socket.create_connection(self._upstream, timeout=_CONNECT_TIMEOUT)
            except OSError:
                return
            upstream.settimeout(None)
            _nodelay(upstream)
            with self._lock:
                conn.upstream = upstream
                if conn.ended or self._closed:
                    return
                conn.alive += 1
            out = threading.Thread(target=self._server_to_learner, args=(conn,), daemon=True,
                                   name=f"retrylab-nats-relay-{conn.num}-out")
            conn.threads.append(out)
            out.start()
            framer = Framer(lambda *op: self._on_learner_op(conn, *op), keep=self._keep)
            self._pump(conn.client, upstream, framer.feed, forward_result=False)
        finally:
            conn.read_all = True
            self._pump_exit(conn)

    def _server_to_learner(self, conn: _Conn) -> None:
        try:
            framer = Framer(lambda *op: self._on_server_op(conn, *op), keep=self._keep, rewrite=self._rewrite)
            self._pump(conn.upstream, conn.client, framer.feed, forward_result=True)
        finally:
            self._pump_exit(conn)

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket, read, forward_result: bool) -> None:
        while True:
            try:
                data = source.recv(_RECV)
            except OSError:
                return
            if not data:
                return
            out = read(data)
            try:
                target.sendall(out if forward_result else data)
            except OSError:
                return

    def _pump_exit(self, conn: _Conn) -> None:
        self._end(conn)
        with self._lock:
            conn.alive -= 1
            last = conn.alive == 0
            if last:
                self._conns.pop(conn.num, None)
        if last:
            for sock in (conn.client, conn.upstream):
                if sock is not None:
                    sock.close()

    def _end(self, conn: _Conn) -> None:
        """Shut both sockets of the pair down: wakes both pumps (closing is left to the last one out)."""
        with self._lock:
            conn.ended = True
            socks = (conn.client, conn.upstream)
        for sock in socks:
            if sock is not None:
                _shutdown(sock)

    # -- recording ---------------------------------------------------------------------------------
    def _rewrite(self, op: str, line: bytes) -> bytes:
        """The server's control line as the learner gets it: INFO without the server's addresses."""
        if op != "INFO":
            return line
        try:
            info = json.loads(line[5:])
        except ValueError:
            return line
        if not isinstance(info, dict):
            return line
        for key in _HIDDEN_INFO:
            info.pop(key, None)
        info["host"], info["port"] = self._address
        return b"INFO " + json.dumps(info, separators=(",", ":")).encode() + b"\r\n"

    def _on_learner_op(self, conn: _Conn, op: str, fields: list, size: int, header_size: int, kept: bytes) -> None:
        with self._lock:
            self.learner_ops += 1
            self.activity += 1
        if op not in _LEARNER_OPS:
            return
        words = [f.decode("utf-8", "replace") for f in fields] if op != "CONNECT" else []
        subject = words[0] if words else ""
        if op in ("PUB", "HPUB"):
            self._record(self._sent, conn, op, size, header_size, kept, subject=subject,
                         reply=words[1] if len(words) > 1 else "")
        elif op == "SUB":
            self._record(self._sent, conn, op, 0, 0, b"", subject=subject, sid=words[-1] if len(words) > 1 else "",
                         queue=words[1] if len(words) > 2 else "")
        elif op == "UNSUB":
            self._record(self._sent, conn, op, 0, 0, b"", sid=subject)
        else:   # CONNECT: its JSON may hold a password or a token; that it came is what counts
            self._record(self._sent, conn, op, 0, 0, b"")

    def _on_server_op(self, conn: _Conn, op: str, fields: list, size: int, header_size: int, kept: bytes) -> None:
        with self._lock:
            self.activity += 1
        if op not in _SERVER_OPS:
            return
        words = [f.decode("utf-8", "replace") for f in fields]
        if op == "-ERR":
            self._record(self._delivered, conn, op, 0, 0, b"", subject=words[0][:500] if words else "")
            return
        self._record(self._delivered, conn, op, size, header_size, kept, subject=words[0] if words else "",
                     sid=words[1] if len(words) > 1 else "", reply=words[2] if len(words) > 2 else "")

    def _record(self, records: list, conn: _Conn, op: str, size: int, header_size: int, kept: bytes,
                **fields) -> None:
        now = time.time()
        with self._lock:
            self._seq += 1
            if len(records) >= self._max_records:
                self.dropped += 1
                return
            truncated = len(kept) < size
            if kept and self._kept + len(kept) > self._max_kept:
                kept, truncated = b"", True
            self._kept += len(kept)
            records.append(Frame(self._seq, conn.num, now, op, size=size, headers=kept[:header_size],
                                 data=kept[header_size:], truncated=truncated, **fields))


def _nodelay(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


_HUNG_UP = select.POLLHUP | getattr(select, "POLLRDHUP", 0)


def _peer_closed(sock: socket.socket) -> bool:
    """Whether the other end of `sock` has closed (or shut down writing): poll, nothing read."""
    fd = sock.fileno()
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN | _HUNG_UP)
    return any(events & _HUNG_UP for _, events in poller.poll(0))


def _wake(listener: socket.socket) -> None:
    """Connect to a unix listener, so its accept() returns now rather than at its next timeout."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as waker:
            waker.settimeout(0.1)
            waker.connect(listener.getsockname())
    except OSError:
        pass


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
