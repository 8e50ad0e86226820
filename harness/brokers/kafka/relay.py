"""The recording relay between a learner's Kafka clients and the check's private broker.

It listens on 127.0.0.1 (a free port) and, when asked, on a unix socket (`serve_unix`: the only way out of
a sandbox with its own network namespace), and relays each connection to the broker frame by frame. A
Kafka client reaches a broker twice: at its bootstrap address, then at the address the broker advertises
in metadata. The relay rewrites that address (in Metadata, FindCoordinator and DescribeCluster responses)
to `advertise`, the learner's own way in, so every connection of every client comes back through it.

On the way it records every request (API, version, client id, size, time) and, for Produce, the topic,
partition and record count of each batch, matched with the base offset the broker acknowledged: the
harness's own delivery report of what the learner produced (Tansu's watermarks are wrong after a batched
produce); for OffsetCommit, the offsets committed. In one order, across connections: a check can tell a
commit made before the produce it should follow. Memory is bounded: requests up to `PARSE_LIMIT` bytes are read whole (while the relay holds at most
`PARSE_BUDGET` bytes of them), others stream through with only their header read (a Produce is then
recorded without its batches); at most `max_records` requests are kept (counters go on beyond that).

Two daemon threads per connection with blocking sockets, as in the Redis relay: a request is recorded
before it is forwarded, so the record's order respects causality across connections.

A check can hold the learner's Fetch requests for a moment (`fetches_held`): the fetches already at the broker
are answered first, then records the harness produces meanwhile, to several partitions one after another,
reach the learner together in the next fetch, as they would from a busier producer. Without it, which of them
a poll returns together is a matter of timing.
"""
from __future__ import annotations

import collections
import contextlib
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from retrylab.background import join_all
from retrylab.brokers.kafka import tansu_compat, wire

MAX_CONNECTIONS = 256
PARSE_LIMIT = 8 << 20           # requests (and Produce responses) read whole up to this size...
PARSE_BUDGET = 32 << 20         # ...while the frames read whole at once, over all connections, stay within this
MAX_FRAME = 100 << 20           # Kafka's own socket.request.max.bytes: a larger frame ends the connection
_PENDING_CAP = 10_000           # requests per connection awaiting a response
_CONNECT_TIMEOUT = 5.0
HOLD_LIMIT = 10.0               # seconds a Fetch is held at most, whatever the check does
DRAIN_LIMIT = 2.0               # seconds fetches_held waits for the fetches at the broker to be answered
_CLOSE_BUDGET = 0.8
# requests that change the broker's state (what `shape` counts besides produced records and committed offsets)
CHANGING = frozenset({11, 13, 14, 19, 20, 21, 22, 24, 25, 26, 28, 37, 42, 47})


@dataclass
class Request:
    seq: int
    at: float                   # time.time() when the relay read it
    conn: int
    api_key: int
    version: int
    client_id: str | None
    size: int
    produced: tuple[wire.ProducedBatch, ...] = ()
    acks: int | None = None     # a Produce's acks (0: the broker sends no response)
    acked: list[wire.ProduceAck] = field(default_factory=list)  # what the broker answered, when it has
    commits: tuple[wire.Commit, ...] = ()   # an OffsetCommit's offsets
    upgraded: bool = False      # sent on in a version the broker answers (tansu_compat): its response goes back


class _Conn:
    def __init__(self, num: int, client: socket.socket):
        self.num = num
        self.client = client
        self.server: socket.socket | None = None
        self.pending: collections.OrderedDict[int, Request] = collections.OrderedDict()
        self.threads: list[threading.Thread] = []
        self.ended = 0          # directions whose pump has ended: the second one closes the sockets


class KafkaRelay:
    def __init__(self, upstream: tuple[str, int], advertise: tuple[str, int] | None = None, *,
                 max_records: int = 100_000, max_connections: int = MAX_CONNECTIONS):
        self.upstream = upstream
        self._advertise = advertise
        self.max_records = max_records
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self._seq = 0
        self._produced: collections.Counter = collections.Counter()   # (topic, partition) -> records
        self._committed: dict[tuple[str, str, int], int] = {}          # (group, topic, partition) -> offset
        self._changes = 0
        self._conns: dict[int, _Conn] = {}
        self._listeners: list[socket.socket] = []
        self._accepters: list[threading.Thread] = []
        self._closed = False
        self._held = 0          # bytes of frames being read whole, over all connections
        self._fetches_held = False
        self._fetch_gate = threading.Condition(self._lock)
        self.refused = 0
        self.connections = 0

    @contextlib.contextmanager
    def fetches_held(self, drain: float = DRAIN_LIMIT):
        """Hold every Fetch request the learner sends (up to HOLD_LIMIT s each) until the block ends, after
        waiting up to `drain` s for the Fetch requests already at the broker to be answered. Yields whether
        they were: when not, a fetch still waiting there may return part of what is produced in the block."""
        with self._fetch_gate:
            self._fetches_held = True
        try:
            deadline = time.monotonic() + drain
            while self._fetches_at_broker() and time.monotonic() < deadline:
                time.sleep(0.01)
            yield not self._fetches_at_broker()
        finally:
            with self._fetch_gate:
                self._fetches_held = False
                self._fetch_gate.notify_all()

    def _fetches_at_broker(self) -> bool:
        with self._lock:
            return any(r.api_key == wire.FETCH for conn in self._conns.values() for r in conn.pending.values())

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> KafkaRelay:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        self._serve(listener)
        return self

    @property
    def address(self) -> tuple[str, int]:
        return self._listeners[0].getsockname()

    @property
    def advertise(self) -> tuple[str, int]:
        """The address every broker is given in metadata: the relay's own TCP address unless told otherwise."""
        return self._advertise or self.address

    @advertise.setter
    def advertise(self, address: tuple[str, int]) -> None:
        self._advertise = address

    def serve_unix(self, path) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o777)   # the learner runs as another uid; its folder (root's, 0755) keeps it in place
        self._serve(listener)

    def _serve(self, listener: socket.socket) -> None:
        listener.listen(128)
        self._listeners.append(listener)
        thread = threading.Thread(target=self._accept_loop, args=(listener,), daemon=True, name="kafka-relay-accept")
        self._accepters.append(thread)
        thread.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._conns.values())
        for listener in self._listeners:
            _shutdown(listener)     # wakes its accept()
            listener.close()
        for conn in conns:
            for sock in (conn.client, conn.server):
                if sock is not None:
                    _shutdown(sock)
        join_all(self._accepters + [t for c in conns for t in c.threads], _CLOSE_BUDGET)

    def __enter__(self) -> KafkaRelay:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what the link reads -----------------------------------------------------------------------
    @property
    def activity(self) -> int:
        """Requests seen so far (all of them, also those no longer kept)."""
        return self._seq

    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def produced(self) -> dict[tuple[str, int], int]:
        """Records the learner produced, per (topic, partition), as its requests counted them."""
        with self._lock:
            return dict(self._produced)

    def committed(self) -> dict[tuple[str, str, int], int]:
        """The last offset the learner committed, per (group, topic, partition), as its requests said."""
        with self._lock:
            return dict(self._committed)

    def changes(self) -> int:
        """Requests that change the broker's state other than by producing or committing (group membership,
        topics, transactions, ...): a commit of the offsets already committed (kafka-python's auto-commit
        repeats them every 5 s) changes nothing."""
        return self._changes

    # -- connections -------------------------------------------------------------------------------
    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed or len(self._conns) >= self.max_connections:
                    self.refused += not self._closed
                    client.close()
                    continue
                self.connections += 1
                conn = _Conn(self.connections, client)
                self._conns[conn.num] = conn
            threading.Thread(target=self._open, args=(conn,), daemon=True, name="kafka-relay-conn").start()

    def _open(self, conn: _Conn) -> None:
        try:
            conn.server = socket.create_connection(self.upstream, timeout=_CONNECT_TIMEOUT)
            conn.server.settimeout(None)
        except OSError:
            self._end(conn, directions=2)
            return
        for sock in (conn.client, conn.server):
            if sock.family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        down = threading.Thread(target=self._pump, args=(conn, conn.server, conn.client, self._on_response), daemon=True,
                                name="kafka-relay-reply")
        conn.threads = [threading.current_thread(), down]
        down.start()
        self._pump(conn, conn.client, conn.server, self._on_request)

    def _end(self, conn: _Conn, directions: int = 1) -> None:
        """One direction of `conn` ended: end the other too (shutdown wakes its recv); the last one closes."""
        with self._lock:
            self._conns.pop(conn.num, None)
            conn.ended += directions
            last = conn.ended >= 2
        for sock in (conn.client, conn.server):
            if sock is not None:
                _shutdown(sock)
                if last:
                    sock.close()

    def _pump(self, conn: _Conn, src: socket.socket, dst: socket.socket, on_frame) -> None:
        """Frames from src to dst, each seen by `on_frame(conn, head, src)`, which returns the frame's
        bytes to send (read whole) or None to stream the rest of it through."""
        try:
            while True:
                size_bytes = _read_exact(src, 4)
                if size_bytes is None:
                    break
                size = struct.unpack(">i", size_bytes)[0]
                if not 8 <= size <= MAX_FRAME:
                    break
                out = on_frame(conn, size, src)
                if out is None:
                    break
                whole, rest = out
                dst.sendall(struct.pack(">i", len(whole) + rest) + whole)
                while rest > 0:     # the unread rest of a large frame, streamed
                    chunk = src.recv(min(rest, 65536))
                    if not chunk:
                        raise OSError("closed in a frame")
                    dst.sendall(chunk)
                    rest -= len(chunk)
        except OSError:
            pass
        finally:
            self._end(conn)

    def _hold(self, size: int, always: bool = False) -> bool:
        """Whether a frame of `size` bytes may be read whole now (`always`: it must be, within PARSE_LIMIT)."""
        with self._lock:
            if size > PARSE_LIMIT or (not always and self._held + size > PARSE_BUDGET):
                return False
            self._held += size
            return True

    def _let_go(self, size: int) -> None:
        with self._lock:
            self._held -= size

    def _on_request(self, conn: _Conn, size: int, src: socket.socket):
        """Read, record and pass on one request: (bytes, 0) read whole, or (head, rest) for a large one."""
        whole = self._hold(size)
        try:
            frame = _read_exact(src, size if whole else min(size, 64))   # a small frame: never into the next
            if frame is None:
                return None
            return self._request(conn, size, frame, whole)
        finally:
            if whole:
                self._let_go(size)

    def _request(self, conn: _Conn, size: int, frame: bytes, whole: bool):
        try:
            header = wire.request_header(frame)
        except wire.Malformed:
            return frame, size - len(frame)     # the broker decides what to make of it
        request = Request(0, time.time(), conn.num, header.api_key, header.version, header.client_id, size)
        rest = size - len(frame)
        try:
            if header.api_key == wire.PRODUCE and whole:
                request.acks, batches = wire.produce_request(header, frame)
                request.produced = tuple(batches)
            elif header.api_key == wire.OFFSET_COMMIT and whole:
                request.commits = tuple(wire.offset_commit_request(header, frame))
            elif tansu_compat.needs_upgrade(header) and whole:
                frame, request.upgraded = tansu_compat.upgraded_request(header, frame), True
        except wire.Malformed:
            pass
        with self._fetch_gate:
            if header.api_key == wire.FETCH:     # checked and recorded at once: fetches_held sees it at the broker
                self._fetch_gate.wait_for(lambda: not self._fetches_held, timeout=HOLD_LIMIT)
                request.at = time.time()
            self._record(conn, request, header.correlation_id)
        return frame, rest

    def _record(self, conn: _Conn, request: Request, correlation_id: int) -> None:
        """Called with self._lock held."""
        self._seq += 1
        request.seq = self._seq
        if len(self._requests) < self.max_records:
            self._requests.append(request)
        for batch in request.produced:
            if batch.records > 0:
                self._produced[(batch.topic, batch.partition)] += batch.records
        for commit in request.commits:
            self._committed[(commit.group, commit.topic, commit.partition)] = commit.offset
        self._changes += request.api_key in CHANGING
        if request.acks != 0:   # acks=0: the broker sends no response
            conn.pending[correlation_id] = request
            if len(conn.pending) > _PENDING_CAP:
                conn.pending.popitem(last=False)

    def _on_response(self, conn: _Conn, size: int, src: socket.socket):
        head = _read_exact(src, 4)
        if head is None:
            return None
        with self._lock:
            request = conn.pending.pop(struct.unpack(">i", head)[0], None)
        rest = size - 4
        # addresses must be rewritten (or the client leaves the relay): those are read whole within the limit alone
        if request is None or (request.api_key not in (wire.PRODUCE, *wire.REWRITTEN) and not request.upgraded) \
                or not self._hold(rest, always=request.api_key != wire.PRODUCE):
            return head, rest
        try:
            body = _read_exact(src, rest)
        finally:
            self._let_go(rest)
        if body is None:
            return None
        try:
            if request.api_key == wire.PRODUCE:
                acked = wire.produce_response(request.version, body)
                with self._lock:
                    request.acked = acked
            elif request.upgraded:
                body = tansu_compat.response_for(request.version, body)
            else:
                host, port = self.advertise
                body = wire.rewrite_addresses(request.api_key, request.version, body, host, port)
        except wire.Malformed:
            pass
        return head + body, 0


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
