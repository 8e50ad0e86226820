"""The harness's own ways into a private nats-server: `AdminClient`, a small synchronous client for
JetStream API requests (emptying a server between checks, reading streams' messages for snapshots), and
`Monitor`, the server's monitoring endpoint (/jsz: every stream and consumer's counts in one request).

Synchronous on purpose: the harness reads the server between and around learner runs from plain threads
(the runner's `Progress`, a backend's reset), where an asyncio loop of nats-py's would need a thread of its own.
"""
from __future__ import annotations

import base64
import collections
import http.client
import json
import secrets
import socket
import time
from dataclasses import dataclass

from retrylab.brokers.nats.protocol import Framer

_CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,"protocol":1,' \
           b'"name":"retrylab-harness","lang":"python"}\r\nPING\r\n'


COLLECTED = 10_000      # messages a subscription keeps between two `received`


class NatsError(RuntimeError):
    """The server did not answer as expected (gone, a protocol error, no answer in time)."""


class JetStreamError(NatsError):
    def __init__(self, code: int, err_code: int, description: str):
        super().__init__(f"{description} ({code}/{err_code})")
        self.code, self.err_code, self.description = code, err_code, description


@dataclass(frozen=True)
class Message:
    subject: str
    reply: str
    headers: bytes      # the header block as sent ("NATS/1.0\r\n..."), b"" if none
    data: bytes


class AdminClient:
    """One connection to the server: `request` sends a message and waits for its reply, `js` a JetStream
    API request, `publish` a plain message; `subscribe` and `received` collect what arrives on a subject
    (read whenever the client waits: e.g. advisories during a learner's run, collected after it; a flood
    beyond COLLECTED per subscription is only counted, and one beyond the server's pending limit for this
    connection, 64 MB, makes the server drop it as a slow consumer: NatsError on the next use).
    Not thread-safe: one per thread."""

    def __init__(self, host: str, port: int, *, timeout: float = 5.0):
        self.timeout = timeout
        self._inbox = f"_INBOX.retrylab.{secrets.token_hex(8)}"
        self._messages: dict[str, collections.deque] = {"1": collections.deque()}   # by subscription id
        self._pongs = 0
        self._errors: list[str] = []
        self._next = 0
        self._sids = 1
        self.overflow: dict[str, int] = {}      # by subscription id: messages beyond COLLECTED, only counted
        self._framer = Framer(self._on_op, keep=1 << 30)   # messages whole: the server caps them at max_payload
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise NatsError(f"cannot connect to nats://{host}:{port}: {exc}") from None
        try:
            self._sock.sendall(_CONNECT + f"SUB {self._inbox}.* 1\r\n".encode())
            self._wait(lambda: self._pongs > 0, "the server's PONG")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    def request(self, subject: str, payload: bytes = b"", *, headers: bytes = b"") -> tuple[bytes, bytes]:
        """Publish `payload` on `subject` and wait for the reply: (its header block, its data)."""
        self._next += 1
        reply = f"{self._inbox}.{self._next}"
        self._send(_pub(subject, reply, payload, headers))
        replies = self._messages["1"]
        self._wait(lambda: any(m.subject == reply for m in replies), f"a reply on {subject}")
        answer = next(m for m in replies if m.subject == reply)
        self._messages["1"] = collections.deque(m for m in replies if m.subject != reply)  # late ones of others
        if answer.headers.startswith(b"NATS/1.0 503"):
            raise NatsError(f"no responders for {subject}")
        return answer.headers, answer.data

    def publish(self, subject: str, payload: bytes = b"", *, headers: bytes = b"") -> None:
        """A plain message (no reply asked), known to have reached the server when this returns."""
        self._send(_pub(subject, "", payload, headers))
        self.flush()

    def js_publish(self, subject: str, payload: bytes = b"", *, headers: bytes = b"") -> dict:
        """A message to a stream, and its PubAck ({"stream", "seq", "duplicate"?}); JetStreamError if refused."""
        _, data = self.request(subject, payload, headers=headers)
        return _answer(subject, data)

    def subscribe(self, subject: str) -> str:
        """Start collecting messages on `subject` (wildcards allowed); its subscription id, for `received`."""
        self._sids += 1
        sid = str(self._sids)
        self._messages[sid] = collections.deque()
        self._send(f"SUB {subject} {sid}\r\n".encode())
        self.flush()
        return sid

    def received(self, sid: str, *, wait: float = 0.0) -> list[Message]:
        """What arrived on subscription `sid` since the last call: all the server had sent when this was
        called, and whatever more comes within `wait` seconds."""
        self.flush()
        if wait > 0:
            deadline = time.monotonic() + wait
            self._read_until(lambda: time.monotonic() >= deadline)
        messages = self._messages[sid]
        taken = list(messages)
        messages.clear()
        return taken

    def flush(self) -> None:
        """Wait until the server has dealt with everything sent so far (a PING answered)."""
        pongs = self._pongs
        self._send(b"PING\r\n")
        self._wait(lambda: self._pongs > pongs, "the server's PONG")

    def js(self, api: str, body: dict | None = None) -> dict:
        """A JetStream API request ($JS.API.<api>) and its JSON answer; JetStreamError for an error answer."""
        _, data = self.request(f"$JS.API.{api}", json.dumps(body).encode() if body is not None else b"")
        return _answer(f"$JS.API.{api}", data)

    def paged(self, api: str, field: str, body: dict | None = None) -> list:
        """Every item of a paged JetStream list (STREAM.NAMES, STREAM.LIST, CONSUMER.LIST.<stream>, ...)."""
        items: list = []
        while True:
            answer = self.js(api, {**(body or {}), "offset": len(items)})
            page = answer.get(field) or []
            items += page
            if not page or len(items) >= answer.get("total", 0):
                return items

    def get_msg(self, stream: str, seq: int, *, next_by_subj: str | None = None) -> dict | None:
        """The stored message at `seq` (or, with `next_by_subj`, the first at or after it on that subject):
        {"subject", "seq", "headers" (bytes), "data" (bytes), "time"}; None if there is none."""
        body = {"seq": seq, **({"next_by_subj": next_by_subj} if next_by_subj else {})}
        try:
            message = self.js(f"STREAM.MSG.GET.{stream}", body)["message"]
        except JetStreamError as exc:
            if exc.code == 404:
                return None
            raise
        return {"subject": message.get("subject", ""), "seq": message.get("seq", seq),
                "headers": base64.b64decode(message.get("hdrs") or ""),
                "data": base64.b64decode(message.get("data") or ""), "time": message.get("time", "")}

    # -- the connection ---------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise NatsError(f"the server closed the connection: {exc}") from None

    def _wait(self, done, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        self._read_until(lambda: done() or time.monotonic() >= deadline)
        if not done():
            raise NatsError(f"no answer from the server in {self.timeout:g} s (waiting for {what})")

    def _read_until(self, stop) -> None:
        """Read what the server sends until `stop()` (asked after each read, and at most every 50 ms)."""
        while not stop():
            if self._errors:
                raise NatsError(f"the server answered -ERR {self._errors[-1]}")
            self._sock.settimeout(0.05)
            try:
                data = self._sock.recv(65536)
            except socket.timeout:
                continue
            except OSError as exc:
                raise NatsError(f"the server closed the connection: {exc}") from None
            if not data:
                raise NatsError("the server closed the connection")
            self._framer.feed(data)
            if self._framer.confused:
                raise NatsError("the server's answer is not NATS protocol")

    def _on_op(self, op: str, fields: list, size: int, header_size: int, kept: bytes) -> None:
        if op in ("MSG", "HMSG"):
            words = [f.decode("utf-8", "replace") for f in fields]
            sid = words[1] if len(words) > 1 else ""
            messages = self._messages.get(sid)
            if messages is None:
                return
            if sid != "1" and len(messages) >= COLLECTED:
                self.overflow[sid] = self.overflow.get(sid, 0) + 1
            else:
                messages.append(Message(words[0], words[2] if len(words) > 2 else "", kept[:header_size],
                                        kept[header_size:]))
        elif op == "PING":
            self._send(b"PONG\r\n")
        elif op == "PONG":
            self._pongs += 1
        elif op == "-ERR":
            self._errors.append(fields[0].decode("utf-8", "replace")[:200])


def _pub(subject: str, reply: str, payload: bytes, headers: bytes) -> bytes:
    to = f" {reply}" if reply else ""
    if headers:
        line = f"HPUB {subject}{to} {len(headers)} {len(headers) + len(payload)}\r\n"
    else:
        line = f"PUB {subject}{to} {len(payload)}\r\n"
    return line.encode() + headers + payload + b"\r\n"


def _answer(subject: str, data: bytes) -> dict:
    """A JetStream answer's JSON; JetStreamError for an error answer."""
    try:
        answer = json.loads(data)
    except ValueError:
        raise NatsError(f"{subject} answered no JSON: {data[:80]!r}") from None
    error = answer.get("error") if isinstance(answer, dict) else None
    if error:
        raise JetStreamError(error.get("code", 0), error.get("err_code", 0), error.get("description", ""))
    return answer


class Monitor:
    """The server's monitoring endpoint (HTTP on its monitor port)."""

    def __init__(self, host: str, port: int, *, timeout: float = 2.0):
        self.host, self.port, self.timeout = host, port, timeout

    def get(self, path: str) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise NatsError(f"the monitoring endpoint {path} did not answer: {exc}") from None
        finally:
            connection.close()

    def json(self, path: str) -> dict:
        status, body = self.get(path)
        if status != 200:
            raise NatsError(f"the monitoring endpoint {path} answered HTTP {status}")
        try:
            return json.loads(body)
        except ValueError:
            raise NatsError(f"the monitoring endpoint {path} answered no JSON") from None

    def streams(self) -> list[dict]:
        """Every stream of the server's (only) account with its state and its consumers' (/jsz)."""
        jsz = self.json("/jsz?streams=true&consumers=true")
        return [stream for account in jsz.get("account_details") or () for stream in account.get("stream_detail") or ()]
