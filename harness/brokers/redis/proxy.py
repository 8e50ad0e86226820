"""A recording TCP relay between a learner's Redis clients and the private Redis server of a check.

`RecordingProxy` listens on 127.0.0.1 (a free port), and on a unix socket too if asked (`serve_unix`: the only way out
of a sandbox with its own network namespace), and relays every connection to the upstream server, byte for byte,
in both directions. On the way it parses what clients send (RESP arrays of bulk strings, and inline commands as typed
into telnet: retrylab.brokers.redis.resp) and records every command (retrylab.brokers.redis.commands), so a check can
see which values a worker pushed, in which order, from which connection. It also parses what the server sends back
(RESP2 and RESP3) just far enough to count replies, which tells which commands are still waiting for theirs:
`pending()` lists e.g. the BLPOP a worker is blocked in, and each recorded command says when its reply passed
(`Command.answered_at`): how long the server, and the relay, took to answer it.

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
* An `intercept` (retrylab.brokers.redis.intercepts) may replace a client's command by another one before the server sees it. The
  relay rewrites the byte stream at command boundaries, one command for one, so the server answers every command in
  the order it was sent, in a pipeline and inside MULTI alike: a refusal is an `EVAL` that returns an error reply
  (`refusal`), a made-up answer an `EVAL` that returns it (`time_answer` for TIME). Only commands named in
  `intercept.names` are held back until complete (bounded per command and per relay: see _HOLD_MAX, a longer one is
  refused); all others stream through. With an intercept, a connection whose stream cannot be parsed, or that sends
  an inline command, is closed, never relayed unfiltered (Redis itself closes a connection on a protocol error).
"""
from __future__ import annotations

import collections
import dataclasses
import fcntl
import os
import platform
import socket
import struct
import termios
import threading
import time

from retrylab.background import join_all
from retrylab.brokers.redis.commands import Command
from retrylab.brokers.redis.intercepts import Intercept, encode, refusal
from retrylab.brokers.redis.resp import NO_NAME, CommandParser, ReplyParser

__all__ = ["MAX_CONNECTIONS", "REDACTED", "RecordingProxy"]


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
_MAP, _SIMPLE, _ARRAY = ord("%"), ord("+"), ord("*")  # reply types that tell which RESP version a HELLO chose


class _Conn:
    __slots__ = ("num", "client", "upstream", "commands", "replies", "pending", "tracking", "proto", "in_multi",
                 "closing", "done", "alive", "threads", "held", "streaming", "oversize")

    def __init__(self, num: int, client: socket.socket, max_arg: int, inline: bool = True):
        self.num = num
        self.client = client
        self.upstream: socket.socket | None = None
        self.commands: CommandParser | None = CommandParser(max_arg, inline=inline)  # None once confused
        self.replies: ReplyParser | None = ReplyParser()  # None once confused
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
            _wake(listener)            # shutdown() does not wake accept() on a unix socket: a connection does
            _shutdown(listener)
        for conn in conns:
            self._end(conn)
        threads = [self._accept_thread] if self._accept_thread else []
        threads += [thread for _, thread in self._unix_listeners]
        join_all(threads + [t for conn in conns for t in list(conn.threads)], _CLOSE_BUDGET)
        # The relay threads close the sockets as they exit (never close a socket another thread may be blocked on);
        # the shutdowns above have already ended both TCP connections of every pair for the peers.

    def commands(self) -> list[Command]:
        with self._snapshot_lock:  # one snapshot at a time; the relay threads only ever append
            with self._lock:
                start = self._materialized
                raw = self._commands[start:]
            made = [Command(*r) for r in raw]  # outside the relay lock: can be a lot at once
            with self._lock:
                for i, (before, now) in enumerate(zip(raw, self._commands[start:start + len(made)])):
                    if now is not before:          # its reply came meanwhile (_answered)
                        made[i] = Command(*now)
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
        except Exception:  # ProtocolConfusion, or a bug: never let it reach the relay
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
        start = parser.fed - len(data)  # the stream offset of data[0]
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
                out += encode(rewrite)
            sent.append(rewrite or args)
            self._let_go(conn)
            conn.streaming = conn.oversize = False
            pos = stop
        tail = data[pos:]
        if tail and not confused:
            name = parser.current_name() if not conn.streaming else NO_NAME
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
        now = time.time()
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
                    self._answered(head, now)
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


    def _answered(self, record: tuple, now: float) -> None:
        """Stamp the recorded command `record` with when its reply came (Command.answered_at); called with the lock
        held. A command's index is its seq - 1 while the record is not full (seq counts dropped commands too)."""
        commands, index = self._commands, record[0] - 1
        if index >= len(commands):
            return
        kept = commands[index]
        if type(kept) is tuple:
            if kept[0] == record[0]:
                commands[index] = kept + (now,)
        elif kept.seq == record[0]:         # made a Command already (a snapshot taken while it waited)
            commands[index] = dataclasses.replace(kept, answered_at=now)


def _nodelay(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


def _wake(listener: socket.socket) -> None:
    """Connect to a unix listener, so its accept() returns now (the accept loop sees the relay closed and
    drops the connection) rather than at its next timeout: 0.2 s of every learner run's cleanup."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as waker:
            waker.settimeout(0.1)
            waker.connect(listener.getsockname())
    except OSError:
        pass        # the accept loop still ends at its timeout


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
