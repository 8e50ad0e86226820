"""The recording relay (retrylab.brokers.redis.proxy) against a learner who attacks it: framing that two servers read differently,
intercepted commands too big to hold, and floods of connections.

Waits poll for a condition and give up after a generous deadline (a hang guard), never to check that something was
fast.
"""
from __future__ import annotations

import socket
import threading

import pytest

from retrylab.brokers.redis import proxy as proxy_module
from retrylab.brokers.redis.endpoint import Endpoint
from retrylab.brokers.redis.proxy import RecordingProxy
from retrylab.brokers.redis.resp import CommandParser, ProtocolConfusion
from retrylab.brokers.redis.relay_guard import AdminGuard

from helpers import WAIT, recv_until_eof, resp, wait_until


def recv_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = sock.recv(1)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    return data


def guarded(endpoint: Endpoint, **kwargs) -> RecordingProxy:
    return RecordingProxy((endpoint.host, endpoint.port), intercept=AdminGuard(0, lang="en"), **kwargs)


# -- framing ----------------------------------------------------------------------------------------------------------

# Redis (and the relay, before it checked) cuts "$64\r" at the '\r' and skips one byte unread; fakeredis reads the line
# up to "\n" and int(b"64\r" + spaces) == 64, so it starts the value 17 bytes later. The relay then saw SET k <64 bytes>
# and ECHO 4 CLIENT KILL TYPE normal (a '\r' of its "$1\r" header swallows the '*' of CLIENT's), while fakeredis ran
# SET k <its 64 bytes> and CLIENT KILL TYPE normal, which the guard refuses.
_KILL = resp("CLIENT", "KILL", "TYPE", "normal")
_VALUE = b"v" * 49 + b"*6\r\n$4\r\nECHO\r\n$"          # fakeredis' value: its tail is the relay's ECHO header
SMUGGLER = resp("SET", "k", "x")[:-6] + b"64\r" + b" " * 16 + b"\r\n" + _VALUE + b"1\r" + _KILL


def test_the_smuggling_payload_is_what_the_relay_used_to_misread():
    assert SMUGGLER.startswith(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$64\r" + b" " * 16 + b"\r\n") and len(_VALUE) == 64
    with pytest.raises(ProtocolConfusion):
        CommandParser(100).feed(SMUGGLER, [])


def test_a_smuggled_command_neither_runs_nor_is_recorded(endpoint):
    with socket.create_connection((endpoint.host, endpoint.port), timeout=WAIT) as victim, guarded(endpoint) as proxy:
        victim.sendall(resp("CLIENT", "SETNAME", "victim"))
        assert recv_line(victim) == b"+OK\r\n"
        with socket.create_connection(proxy.address, timeout=WAIT) as learner:
            learner.sendall(SMUGGLER)
            assert recv_until_eof(learner) == b""            # the relay closed the connection, answering nothing
        victim.sendall(resp("PING"))
        assert recv_line(victim) == b"+PONG\r\n"            # CLIENT KILL TYPE normal did not run
        with endpoint.client() as direct:
            assert direct.exists("k") == 0                   # nor did the SET either server might have seen
        assert [c.args for c in proxy.commands()] == []      # and nothing was recorded as something else


@pytest.mark.parametrize("stream", [
    b"*1\r $4\r\nPING\r\n",                 # '\r' followed by anything but '\n'
    b"*1\r\n$4\r PING\r\n",
    b"*1\r\n$ 4\r\nPING\r\n",               # what int() takes and string2ll() does not
    b"*1\r\n$4 \r\nPING\r\n",
    b"*1\r\n$+4\r\nPING\r\n",
    b"*1\r\n$0_4\r\nPING\r\n",
    b"* 1\r\n$4\r\nPING\r\n",
    b"*1\r\n$4\r\nPINGxx",                  # a bulk argument not followed by CRLF
    b"*2\r\n$4\r\nECHO\r\n$3\r\nabc\n\r",
    b"*1\r\n$" + b"1" * 21 + b"\r\n",       # longer than any number string2ll() reads
])
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_the_parser_follows_only_framing_every_server_reads_alike(stream, step):
    parser, out = CommandParser(16), []
    with pytest.raises(ProtocolConfusion):
        for start in range(0, len(stream), step):
            parser.feed(stream[start:start + step], out)
    assert out == []


def test_a_bad_length_line_is_declared_before_it_ends():
    """A partial line may be streamed upstream with its command: it must already be wrong for nobody."""
    parser, out = CommandParser(16), []
    parser.feed(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$6", out)
    with pytest.raises(ProtocolConfusion):
        parser.feed(b" ", out)


def test_an_intercepting_parser_takes_no_inline_command():
    out = []
    with pytest.raises(ProtocolConfusion):
        CommandParser(16, inline=False).feed(resp("PING") + b"PING\r\n", out)
    assert out == [((b"PING",), False)]                     # what came before stays valid
    CommandParser(16).feed(b"PING\r\n", out)               # a recording-only relay still follows them
    assert out == [((b"PING",), False)] * 2


def test_an_intercepting_relay_closes_on_an_inline_command(private_redis_server):
    with guarded(private_redis_server) as proxy, socket.create_connection(proxy.address, timeout=WAIT) as learner:
        learner.sendall(resp("PING") + b"CLIENT KILL TYPE normal\r\n")
        assert recv_until_eof(learner) == b"+PONG\r\n"
        assert [c.name for c in proxy.commands()] == ["PING"]


# -- what an intercepting relay holds back ----------------------------------------------------------------------------

def _connection(proxy: RecordingProxy):
    return wait_until(lambda: list(proxy._conns.values()), "the relay to take the connection")[0]


def test_an_intercepted_command_declaring_a_big_argument_is_refused_without_holding_it(endpoint):
    head = b"*2\r\n$6\r\nCLIENT\r\n$2000000\r\n"
    with guarded(endpoint) as proxy, socket.create_connection(proxy.address, timeout=WAIT) as learner:
        learner.sendall(head + b"x" * 500_000)
        conn = _connection(proxy)
        wait_until(lambda: conn.commands.fed == len(head) + 500_000, "the relay to read what was sent")
        assert len(conn.held) == 0 and proxy._held == 0     # nothing held: the declared length says it is refused
        learner.sendall(b"x" * 1_500_000 + b"\r\n" + resp("PING"))
        assert recv_line(learner).endswith(b"too long for the relay\r\n")
        assert recv_line(learner) == b"+PONG\r\n"           # the connection goes on
    assert [c.name for c in proxy.commands()] == ["CLIENT", "PING"]


@pytest.mark.parametrize("size, refused", [(60_000, False), (70_000, True)])
def test_the_hold_limit_does_not_depend_on_how_the_command_arrives(private_redis_server, size, refused):
    command = resp("CLIENT", "SETNAME", "n" * size)
    with guarded(private_redis_server) as proxy:
        for step in (len(command), 4096):
            with socket.create_connection(proxy.address, timeout=WAIT) as learner:
                learner.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for start in range(0, len(command), step):
                    learner.sendall(command[start:start + step])
                reply = recv_line(learner)
                assert (b"too long for the relay" in reply) == refused, (step, reply)
                assert refused or reply == b"+OK\r\n"


def test_all_connections_together_hold_at_most_the_budget(private_redis_server, monkeypatch):
    monkeypatch.setattr(proxy_module, "_HOLD_BUDGET", 100_000)
    head = resp("CLIENT", "SETNAME", "n" * 40_000)
    with guarded(private_redis_server) as proxy:
        learners = [socket.create_connection(proxy.address, timeout=WAIT) for _ in range(3)]
        try:
            for number, learner in enumerate(learners, 1):
                learner.sendall(head[:-100])                 # held back, waiting for the rest
                read = number * (len(head) - 100)
                wait_until(lambda: sum(c.commands.fed for c in list(proxy._conns.values())) == read,
                           "the relay to read what was sent")
            assert proxy._held <= 100_000
            assert sorted(len(c.held) for c in list(proxy._conns.values())) == [0, len(head) - 100, len(head) - 100]
            replies = []
            for learner in learners:
                learner.sendall(head[-100:])
                replies.append(recv_line(learner))
            assert replies[:2] == [b"+OK\r\n", b"+OK\r\n"]
            assert b"too long for the relay" in replies[2]   # the one that found the budget spent
            assert proxy._held == 0
        finally:
            for learner in learners:
                learner.close()


# -- connections ------------------------------------------------------------------------------------------------------

def test_connections_beyond_the_cap_are_refused_and_counted(private_redis_server, tmp_path):
    with RecordingProxy((private_redis_server.host, private_redis_server.port), max_connections=3) as proxy:
        proxy.serve_unix(tmp_path / "redis.sock")
        first = [socket.create_connection(proxy.address, timeout=WAIT) for _ in range(3)]
        for sock in first:
            sock.sendall(resp("PING"))
            assert recv_line(sock) == b"+PONG\r\n"
        extra = socket.create_connection(proxy.address, timeout=WAIT)
        assert recv_until_eof(extra) == b""
        extra.close()
        with socket.socket(socket.AF_UNIX) as over_unix:
            over_unix.settimeout(WAIT)
            over_unix.connect(str(tmp_path / "redis.sock"))
            assert recv_until_eof(over_unix) == b""
        assert proxy.refused == 2
        first.pop().close()                                  # a slot frees up once its pair has ended
        wait_until(lambda: len(proxy._conns) == 2, "the relay to forget the closed pair")
        with socket.create_connection(proxy.address, timeout=WAIT) as again:
            again.sendall(resp("PING"))
            assert recv_line(again) == b"+PONG\r\n"
        for sock in first:
            sock.close()
    assert proxy.refused == 2


def test_a_flood_of_blocked_connections_is_capped_and_closes_quickly(private_redis_server):
    proxy = RecordingProxy((private_redis_server.host, private_redis_server.port), intercept=AdminGuard(0)).start()
    sockets = []
    try:
        for _ in range(proxy_module.MAX_CONNECTIONS + 20):
            sock = socket.create_connection(proxy.address, timeout=WAIT)
            sockets.append(sock)
            try:
                sock.sendall(resp("BLPOP", "never", 0))
            except OSError:
                pass                                         # refused already
        wait_until(lambda: len(proxy.pending()) == proxy_module.MAX_CONNECTIONS, "every accepted BLPOP to block")
        # the last clients may still wait in the listen backlog: each is refused as it is accepted
        wait_until(lambda: proxy.refused >= 20, "the 20 clients over the cap to be refused")
        assert proxy.refused == 20 and len(proxy._conns) == proxy_module.MAX_CONNECTIONS
        closer = threading.Thread(target=proxy.close, daemon=True)
        closer.start()
        closer.join(WAIT)
        assert not closer.is_alive(), "close() hung"
        prefix = f"retrylab-proxy-{proxy.address[1]}"
        wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith(prefix)],
                   "every relay thread to end")
    finally:
        proxy.close()
        for sock in sockets:
            sock.close()
