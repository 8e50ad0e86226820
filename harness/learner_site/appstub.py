"""The learner-side end of the application channel (retrylab.appchannel): what an exercise's stub
module uses to hand each call to the harness and to follow the run's clock.

One connection per process (a forked child opens its own), shared by its threads under a lock: one
request, one reply. Nothing here decides anything; the reply says what to return or raise.
Imported by every learner process (the virtual clock uses it), so json and socket are imported only
when a first request is made: a script that never sleeps nor calls the module does not pay for them.
"""
import builtins
import os
import threading

SOCKET_VARIABLE = "RETRYLAB_APP_SOCKET"
ARG_LIMIT = 32 << 10        # characters of an argument's JSON sent to the harness
_HEADER_SIZE = 4            # a frame's length, 4 bytes big-endian
_REPLY_LIMIT = 1 << 20

_lock = threading.Lock()
_sock = None
on_offset = None            # set by the virtual clock: called with the run's offset from every reply


class ChannelClosed(RuntimeError):
    """The harness no longer answers (the run is over)."""


def available() -> bool:
    return bool(os.environ.get(SOCKET_VARIABLE))


def _reset_after_fork() -> None:
    global _lock, _sock
    _lock, _sock = threading.Lock(), None   # the parent's connection and lock are the parent's


os.register_at_fork(after_in_child=_reset_after_fork)


def disconnect() -> None:
    """Close this process's connection (the next request opens one to the socket named then)."""
    global _sock
    with _lock:
        if _sock is not None:
            _sock.close()
            _sock = None


def _recv_exactly(sock, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ChannelClosed("retrylab: the harness closed the application channel")
        data += chunk
    return bytes(data)


def request(message: dict) -> dict:
    """Send one request, return the harness's reply (and pass its clock offset on)."""
    global _sock
    import json
    import socket
    body = json.dumps(message).encode()
    with _lock:
        try:
            if _sock is None:
                _sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                _sock.connect(os.environ[SOCKET_VARIABLE])
            _sock.sendall(len(body).to_bytes(_HEADER_SIZE, "big") + body)
            length = int.from_bytes(_recv_exactly(_sock, _HEADER_SIZE), "big")
            if length > _REPLY_LIMIT:
                raise ChannelClosed("retrylab: an unreadable reply from the harness")
            reply = json.loads(_recv_exactly(_sock, length))
        except (OSError, KeyError, ValueError) as exc:
            if _sock is not None:
                _sock.close()
                _sock = None
            if isinstance(exc, ChannelClosed):
                raise
            raise ChannelClosed(f"retrylab: the harness's application channel failed: {exc!r}") from None
    if on_offset is not None and isinstance(reply.get("offset"), (int, float)):
        on_offset(float(reply["offset"]))
    return reply


def describe(value) -> dict:
    """An argument as the harness reads it: its JSON text (anything not JSON as its repr), bounded."""
    import json
    try:
        text = json.dumps(value, default=repr, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        try:
            text = json.dumps(value, default=repr)   # keys of mixed types cannot be sorted
        except (TypeError, ValueError, RecursionError):
            text = json.dumps(repr(value)[:ARG_LIMIT])
    return {"json": text[:ARG_LIMIT], "type": type(value).__name__, "truncated": len(text) > ARG_LIMIT}


def call(namespace: dict, fn: str, *args):
    """Ask the harness to run `fn(*args)`; return its value or raise its exception, of the class the
    stub module (`namespace`) or the builtins name."""
    reply = request({"op": "call", "fn": fn, "pid": os.getpid(), "args": [describe(a) for a in args]})
    error = reply.get("error")
    if error is None:
        return reply.get("value")
    raise _exception(namespace, error)


def _exception(namespace: dict, error: dict) -> BaseException:
    name, message = str(error.get("class")), str(error.get("message"))
    cls = namespace.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = RuntimeError
    exc = cls.__new__(cls, message)
    exc.args = (message,)
    for key, value in (error.get("attrs") or {}).items():
        setattr(exc, key, value)
    return exc
