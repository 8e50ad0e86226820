"""Tests of the recording relay (retrylab.brokers.redis.proxy) against a private redis-server and fakeredis' TCP server.

No assertion here depends on timing: waits poll for a condition and give up only after a generous deadline (a hang
guard), never to check that something was fast.
"""
from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import FrozenInstanceError, dataclass

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry
from fakeredis import TcpFakeServer

from retrylab import background
from retrylab.brokers.redis import intercepts
from retrylab.brokers.redis import proxy as proxy_module
from retrylab.brokers.redis.commands import Command
from retrylab.brokers.redis.endpoint import Endpoint, free_port
from retrylab.brokers.redis.proxy import REDACTED, RecordingProxy
from retrylab.brokers.redis.resp import _HEADER_MAX, CommandParser, ProtocolConfusion, ReplyParser, split_inline

from helpers import WAIT, recv_until_eof, resp, wait_until

BLOCK = 30  # BLPOP timeout in seconds: longer than any wait, so a BLPOP only ends by getting an element
HANDSHAKE = {"HELLO", "CLIENT", "AUTH", "SELECT"}  # what redis-py sends on its own when it connects


# -- helpers ----------------------------------------------------------------------------------------------------------

def recv_exactly(sock: socket.socket, expected: bytes) -> None:
    data = b""
    while len(data) < len(expected):
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}, expected {expected!r}"
        data += chunk
    assert data == expected


def recv_values(sock: socket.socket, count: int) -> bytes:
    """Read until `count` complete top-level RESP values (push messages included) have arrived."""
    parser, data, seen = ReplyParser(), b"", 0
    while seen < count:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
        seen += parser.feed(chunk)[1]
    return data


def through(proxy: RecordingProxy, **kwargs) -> redis.Redis:
    """A redis-py client connected through the proxy; it never retries (a retry would send a command twice)."""
    kwargs.setdefault("socket_timeout", 2 * BLOCK)
    kwargs.setdefault("retry", Retry(NoBackoff(), 0))
    return redis.Redis(host=proxy.address[0], port=proxy.address[1], **kwargs)


def user_commands(proxy: RecordingProxy) -> list[Command]:
    return [c for c in proxy.commands() if c.name not in HANDSHAKE]


def proxy_threads(proxy: RecordingProxy) -> list[threading.Thread]:
    prefix = f"retrylab-proxy-{proxy.address[1]}"
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def assert_blpop_tracked(proxy: RecordingProxy, client: redis.Redis, pusher: redis.Redis, key: str = "probe") -> None:
    """`client` (one connection) blocks in BLPOP: pending() must show it until `pusher` feeds the list."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=client.blpop(key, timeout=BLOCK)), daemon=True)
    thread.start()
    wait_until(lambda: [c for c in proxy.pending() if c.args == (b"BLPOP", key.encode(), str(BLOCK).encode())],
               "the BLPOP to show as pending")
    pusher.rpush(key, "x")
    thread.join(2 * BLOCK)
    assert not thread.is_alive()
    assert list(result["value"]) == [key.encode(), b"x"]
    assert proxy.pending() == []


# -- backends ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fake_server():
    server = TcpFakeServer(("127.0.0.1", 0))  # port 0: the OS picks a free port, no probing race
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@dataclass
class Backend:
    kind: str
    endpoint: Endpoint

    @property
    def address(self) -> tuple[str, int]:
        return (self.endpoint.host, self.endpoint.port)

    def direct(self, **kwargs) -> redis.Redis:
        return redis.Redis(host=self.endpoint.host, port=self.endpoint.port, socket_timeout=WAIT, **kwargs)

    def client_names(self) -> set[str]:
        with self.direct(protocol=2) as r:
            return {entry.get("name", "") for entry in r.client_list()}


@pytest.fixture(params=["real", "fake"])
def backend(request) -> Backend:
    if request.param == "real":
        endpoint = request.getfixturevalue("private_redis_server")
    else:
        server = request.getfixturevalue("fake_server")
        endpoint = Endpoint("127.0.0.1", server.server_address[1])
    backend = Backend(request.param, endpoint)
    with backend.direct() as r:
        r.flushall()
    return backend


@pytest.fixture
def proxy(backend):
    with RecordingProxy(backend.address) as proxy:
        yield proxy


# -- recording --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", [2, 3])
def test_records_commands_in_order_with_args(backend, proxy, protocol):
    r = through(proxy, protocol=protocol)
    before = time.time()
    assert r.set("k", "v")
    assert r.rpush("q", "a", b"\x00\xff\r\n", "") == 3
    assert r.get("k") == b"v"
    assert r.delete("k", "q") == 2
    after = time.time()

    commands = user_commands(proxy)
    assert [c.args for c in commands] == [
        (b"SET", b"k", b"v"),
        (b"RPUSH", b"q", b"a", b"\x00\xff\r\n", b""),
        (b"GET", b"k"),
        (b"DEL", b"k", b"q"),
    ]
    assert [c.name for c in commands] == ["SET", "RPUSH", "GET", "DEL"]
    assert all(isinstance(c, Command) and not c.truncated for c in commands)
    assert all(before <= c.at <= after for c in commands)
    assert len({c.conn for c in commands}) == 1
    everything = proxy.commands()
    assert [c.seq for c in everything] == list(range(1, len(everything) + 1))
    assert proxy.pending() == []  # every reply has reached the client, so none can still be pending
    assert proxy.dropped == 0


def test_seq_orders_commands_across_connections(backend, proxy):
    a = through(proxy, protocol=2, single_connection_client=True)
    b = through(proxy, protocol=2, single_connection_client=True)
    a.rpush("q", "1")
    b.rpush("q", "2")
    assert a.lpop("q") == b"1"
    assert b.lpop("q") == b"2"
    commands = user_commands(proxy)
    conn_a, conn_b = commands[0].conn, commands[1].conn
    assert conn_a != conn_b
    assert [(c.conn, c.args) for c in commands] == [
        (conn_a, (b"RPUSH", b"q", b"1")), (conn_b, (b"RPUSH", b"q", b"2")),
        (conn_a, (b"LPOP", b"q")), (conn_b, (b"LPOP", b"q")),
    ]
    assert [c.seq for c in commands] == sorted(c.seq for c in commands)


def test_commands_returns_a_snapshot(backend, proxy):
    r = through(proxy, protocol=2)
    r.ping()
    first = proxy.commands()
    first.clear()
    r.ping()
    second = proxy.commands()
    assert len(second) >= 2
    assert second[-1].name == "PING"
    with pytest.raises(FrozenInstanceError):
        second[-1].seq = 0


def test_pipeline(backend, proxy):
    r = through(proxy)
    with r.pipeline(transaction=False) as pipe:
        for i in range(500):
            pipe.rpush("jobs", f"job-{i}")
        pipe.llen("jobs")
        assert pipe.execute() == list(range(1, 501)) + [500]
    assert [c.args for c in user_commands(proxy)] == (
        [(b"RPUSH", b"jobs", f"job-{i}".encode()) for i in range(500)] + [(b"LLEN", b"jobs")])
    assert proxy.pending() == []


def test_pipeline_deeper_than_the_pending_cap_stays_in_step(backend, proxy):
    depth = proxy_module._PENDING_CAP + 2_500
    r = through(proxy, single_connection_client=True)
    with r.pipeline(transaction=False) as pipe:
        for i in range(depth):
            pipe.rpush("deep", i)
        results = pipe.execute()
    assert results[-1] == depth
    assert len(user_commands(proxy)) == depth
    assert proxy.pending() == []
    assert_blpop_tracked(proxy, r, backend.direct())


def test_multi_exec(backend, proxy):
    r = through(proxy)
    with r.pipeline(transaction=True) as pipe:
        pipe.incr("n")
        pipe.rpush("q", "a")
        pipe.lrange("q", 0, -1)
        assert pipe.execute() == [1, 1, [b"a"]]
    assert [c.name for c in user_commands(proxy)] == ["MULTI", "INCRBY", "RPUSH", "LRANGE", "EXEC"]
    assert proxy.pending() == []


@pytest.mark.parametrize("protocol", [2, 3])
def test_transactions_keep_reply_tracking_in_step(backend, proxy, protocol):
    r = through(proxy, protocol=protocol, single_connection_client=True)
    assert r.execute_command("MULTI") in (b"OK", True, "OK")
    assert r.execute_command("INCR", "n") == b"QUEUED"
    # never blocks inside a transaction (redis-py's BLPOP callback turns the status into a tuple of ints)
    assert bytes(r.execute_command("BLPOP", "never", 1)) == b"QUEUED"
    assert r.execute_command("EXEC") == [1, None]
    assert proxy.pending() == []
    # a queue-time error aborts the transaction: EXEC still gets exactly one (error) reply
    r.execute_command("MULTI")
    with pytest.raises(redis.ResponseError):
        r.execute_command("SET", "only-a-key")
    assert r.execute_command("GET", "n") == b"QUEUED"
    with pytest.raises(redis.ResponseError, match="discarded"):  # -EXECABORT
        r.execute_command("EXEC")
    assert proxy.pending() == []
    assert_blpop_tracked(proxy, r, backend.direct())


def test_resp3_client(backend, proxy):
    r = through(proxy, protocol=3, single_connection_client=True)
    r.hset("h", mapping={"a": "1", "b": "2"})
    assert r.hgetall("h") == {b"a": b"1", b"b": b"2"}  # a RESP3 map
    r.sadd("s", "x", "y")
    assert r.smembers("s") == {b"x", b"y"}  # a RESP3 set
    r.zadd("z", {"m": 1.5})
    assert r.zscore("z", "m") == 1.5  # a RESP3 double
    assert r.get("missing") is None  # a RESP3 null
    hello = [c for c in proxy.commands() if c.name == "HELLO"]
    assert hello and hello[0].args[:2] == (b"HELLO", b"3")
    assert [c.name for c in user_commands(proxy)] == ["HSET", "HGETALL", "SADD", "SMEMBERS", "ZADD", "ZSCORE", "GET"]
    assert proxy.pending() == []
    assert_blpop_tracked(proxy, r, backend.direct())


def test_asyncio_client(backend, proxy):
    async def scenario():
        worker = redis.asyncio.Redis(host=proxy.address[0], port=proxy.address[1], socket_timeout=2 * BLOCK)
        producer = redis.asyncio.Redis(host=proxy.address[0], port=proxy.address[1], socket_timeout=WAIT)
        try:
            await worker.rpush("jobs", "a", "b")
            async with worker.pipeline(transaction=True) as pipe:
                pipe.lpop("jobs")
                pipe.llen("jobs")
                assert await pipe.execute() == [b"a", 1]
            await worker.delete("jobs")
            task = asyncio.create_task(worker.blpop("jobs", timeout=BLOCK))
            deadline = time.monotonic() + WAIT
            while not [c for c in proxy.pending() if c.name == "BLPOP"]:
                assert time.monotonic() < deadline, "gave up waiting for the BLPOP to show as pending"
                await asyncio.sleep(0.005)
            await producer.rpush("jobs", "c")
            assert list(await task) == [b"jobs", b"c"]
            assert proxy.pending() == []
        finally:
            await worker.aclose()
            await producer.aclose()

    asyncio.run(scenario())
    assert [c.name for c in user_commands(proxy)] == ["RPUSH", "MULTI", "LPOP", "LLEN", "EXEC", "DEL", "BLPOP", "RPUSH"]


@pytest.mark.parametrize("protocol", [2, 3])
def test_blpop_is_pending_while_blocked(backend, proxy, protocol):
    worker = through(proxy, protocol=protocol)
    producer = through(proxy, protocol=protocol)
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=worker.blpop("jobs", timeout=BLOCK)), daemon=True)
    thread.start()
    wait_until(lambda: [c for c in proxy.pending() if c.name == "BLPOP"], "the BLPOP to show as pending")
    pending = proxy.pending()
    assert [c.args for c in pending] == [(b"BLPOP", b"jobs", str(BLOCK).encode())]
    blocked = pending[0]
    assert blocked in proxy.commands()

    producer.rpush("jobs", "job-1")
    thread.join(2 * BLOCK)
    assert not thread.is_alive()
    assert list(result["value"]) == [b"jobs", b"job-1"]
    assert proxy.pending() == []  # gone before the worker could see its reply
    push = [c for c in proxy.commands() if c.name == "RPUSH"]
    assert [c.args for c in push] == [(b"RPUSH", b"jobs", b"job-1")]
    assert push[0].seq > blocked.seq and push[0].conn != blocked.conn


def test_large_value_is_forwarded_intact_and_recorded_truncated(backend):
    # fakeredis' TCP server takes time quadratic in the size of a value it receives (about 150 s for 20 MB) and fails
    # to send replies of several MB to a reader that is not fast enough; give it a smaller (still multi-read) value.
    size = 20 * 2**20 if backend.kind == "real" else 2**20
    value = os.urandom(size)  # any byte can occur, CR LF included
    with RecordingProxy(backend.address, max_arg_bytes=1000) as proxy:
        r = through(proxy, protocol=2)
        assert r.set("big", value)
        assert r.get("big") == value
        with backend.direct() as direct:
            assert direct.get("big") == value
        commands = user_commands(proxy)
        assert commands[0].args == (b"SET", b"big", value[:1000]) and commands[0].truncated
        assert commands[1].args == (b"GET", b"big") and not commands[1].truncated
        assert proxy.pending() == []


def test_command_parser_streams_a_huge_argument():
    parser = CommandParser(max_arg=100)
    value = os.urandom(20 * 2**20)
    stream = resp("SET", "big", value) + resp("PING")
    out = []
    for start in range(0, len(stream), 65536):
        parser.feed(stream[start:start + 65536], out)
        assert len(parser._buf) <= 64 and len(parser._part) <= 100  # nothing buffered beyond the recorded prefix
    assert out == [((b"SET", b"big", value[:100]), True), ((b"PING",), False)]


# -- connections ------------------------------------------------------------------------------------------------------

VICTIM = """
import sys, time, redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]), socket_timeout=30)
r.client_setname(sys.argv[2])
r.rpush("victim-was-here", "1")
print("ready", flush=True)
time.sleep(120)
"""


def test_killed_client_closes_its_upstream_connection(backend, proxy):
    name = f"victim-{os.getpid()}-{random.randrange(10**9)}"
    proc = subprocess.Popen([sys.executable, "-c", VICTIM, str(proxy.address[1]), name],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert name in backend.client_names()
        assert [c.args for c in user_commands(proxy)] == [(b"RPUSH", b"victim-was-here", b"1")]
        proc.kill()
        proc.wait()
        wait_until(lambda: name not in backend.client_names(), "the server to see the upstream connection closed")
        wait_until(lambda: not proxy._conns and not [t for t in proxy_threads(proxy) if "-c" in t.name],
                   "the proxy to forget the pair")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_close_returns_with_clients_connected(backend):
    proxy = RecordingProxy(backend.address).start()
    idle = through(proxy, single_connection_client=True, client_name="close-idle")
    idle.ping()
    blocked = through(proxy, single_connection_client=True, client_name="close-blocked")
    outcome = {}

    def block():
        try:
            outcome["value"] = blocked.blpop("never", timeout=BLOCK)
        except redis.ConnectionError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=block, daemon=True)
    thread.start()
    wait_until(lambda: [c for c in proxy.pending() if c.name == "BLPOP"], "the BLPOP to show as pending")
    partial = socket.create_connection(proxy.address, timeout=WAIT)
    partial.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100\r\nonly-part-of-it")  # stopped mid-command
    wait_until(lambda: len(proxy._conns) == 3, "three connections")

    closer = threading.Thread(target=proxy.close, daemon=True)
    closer.start()
    closer.join(WAIT)
    assert not closer.is_alive(), "close() hung"
    thread.join(WAIT)
    assert not thread.is_alive() and "error" in outcome
    assert recv_until_eof(partial) == b""
    partial.close()
    with pytest.raises(redis.ConnectionError):
        idle.ping()
    # fakeredis notices a closed connection only once the command it is blocked in has returned (BLPOP: 30 s later)
    names = {"close-idle", "close-blocked"} if backend.kind == "real" else {"close-idle"}
    wait_until(lambda: not names & backend.client_names(), "the server to see the upstream connections closed")
    wait_until(lambda: not proxy_threads(proxy), "every proxy thread to end")
    proxy.close()  # idempotent


def test_closed_connections_are_forgotten(backend, proxy):
    for _ in range(30):
        with socket.create_connection(proxy.address, timeout=WAIT) as sock:
            sock.sendall(resp("PING"))
            recv_exactly(sock, b"+PONG\r\n")
    wait_until(lambda: not proxy._conns and not [t for t in proxy_threads(proxy) if "-c" in t.name],
               "the proxy to forget closed pairs")
    assert [c.name for c in proxy.commands()] == ["PING"] * 30


def test_client_half_close_still_gets_its_replies(backend, proxy):
    with socket.create_connection(proxy.address, timeout=WAIT) as sock:
        sock.sendall(resp("PING") + resp("PING"))
        sock.shutdown(socket.SHUT_WR)
        assert recv_until_eof(sock) == b"+PONG\r\n+PONG\r\n"


def test_upstream_connect_failure_closes_the_client():
    with RecordingProxy(("127.0.0.1", free_port())) as proxy:  # nothing listens there
        for _ in range(2):
            with socket.create_connection(proxy.address, timeout=WAIT) as sock:
                assert recv_until_eof(sock) == b""
        assert proxy.commands() == []


def test_relays_arbitrary_bytes_unchanged_both_ways():
    """Neither parser may alter or hold back what it cannot make sense of: an echo server gets and returns junk."""
    listener = socket.create_server(("127.0.0.1", 0))

    def echo():
        conn, _ = listener.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    payload = b"".join([resp("SET", "k", "v"), b"PING\r\n", os.urandom(3 * 2**20), resp("GET", "k"), b"\r\n*x\r\n"])
    with RecordingProxy(listener.getsockname()) as proxy:
        with socket.create_connection(proxy.address, timeout=WAIT) as sock:
            def send():
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)

            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            assert recv_until_eof(sock) == payload
            sender.join(WAIT)
        assert [c.args for c in proxy.commands()][:2] == [(b"SET", b"k", b"v"), (b"PING",)]
    listener.close()


GARBAGE = {
    "binary": b"\x00\xff\xfe\xfd garbage\r\n",
    "bad-count": b"*abc\r\n",
    "negative-bulk": b"*2\r\n$-5\r\nxx\r\n",
    "no-dollar": b"*1\r\nXYZ\r\n",
    "huge-count": b"*99999999999999\r\n",
    "huge-bulk": b"*1\r\n$99999999999\r\n",
    "unbalanced-quotes": b'SET "unbalanced\r\n',
    "random": random.Random(7).randbytes(200_000),
}


@pytest.mark.parametrize("garbage", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_from_a_client_does_not_hurt_the_proxy(backend, proxy, garbage):
    with socket.create_connection(proxy.address, timeout=WAIT) as sock:
        try:
            sock.sendall(garbage)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may have closed already
        recv_until_eof(sock)  # whatever the server made of it, the pair ends
    r = through(proxy, protocol=2)
    r.set("after", "ok")
    assert r.get("after") == b"ok"
    assert [c.args for c in user_commands(proxy)][-2:] == [(b"SET", b"after", b"ok"), (b"GET", b"after")]
    assert proxy.pending() == []
    assert_blpop_tracked(proxy, through(proxy, single_connection_client=True), backend.direct())


def test_max_commands_counts_what_it_drops(backend):
    with RecordingProxy(backend.address, max_commands=10) as proxy:
        with socket.create_connection(proxy.address, timeout=2 * BLOCK) as sock:
            sock.sendall(resp("PING") * 25)
            recv_exactly(sock, b"+PONG\r\n" * 25)
            assert [c.seq for c in proxy.commands()] == list(range(1, 11))
            assert proxy.dropped == 15
            # recording has stopped, reply tracking has not
            sock.sendall(resp("BLPOP", "q", BLOCK))
            blocked = wait_until(proxy.pending, "the BLPOP to show as pending")
            assert [(c.seq, c.args) for c in blocked] == [(26, (b"BLPOP", b"q", str(BLOCK).encode()))]
            with backend.direct() as direct:
                direct.rpush("q", "v")
            recv_exactly(sock, b"*2\r\n$1\r\nq\r\n$1\r\nv\r\n")
            assert proxy.pending() == []
            assert proxy.dropped == 16
            assert len(proxy.commands()) == 10


def test_activity_counts_commands_and_replies(backend, proxy):
    r = through(proxy, protocol=2)
    r.ping()
    before = proxy.activity
    r.ping()
    assert proxy.activity == before + 2
    with r.pipeline(transaction=False) as pipe:
        pipe.ping()
        pipe.ping()
        pipe.execute()
    assert proxy.activity == before + 6


# -- pub/sub and other reply flows ------------------------------------------------------------------------------------

def test_each_command_says_when_its_reply_passed(backend, proxy):
    """Command.answered_at: when the relay read the reply, at or after the command; a blocking read's comes when it
    returned, also in a snapshot taken while it waited (which itself keeps None)."""
    r = through(proxy, single_connection_client=True)
    with r.pipeline(transaction=False) as pipe:
        for i in range(50):
            pipe.rpush("answered", i)
        pipe.execute()
    pushed = [c for c in user_commands(proxy) if c.name == "RPUSH"]
    assert len(pushed) == 50 and all(c.at <= c.answered_at <= time.time() for c in pushed)

    thread = threading.Thread(target=lambda: r.blpop("nothing-here", timeout=1), daemon=True)
    thread.start()
    wait_until(lambda: [c for c in proxy.pending() if c.name == "BLPOP"], "the BLPOP to show as pending")
    waiting = [c for c in proxy.commands() if c.name == "BLPOP"]
    assert [c.answered_at for c in waiting] == [None]
    thread.join(2 * BLOCK)
    (read,) = [c for c in proxy.commands() if c.name == "BLPOP"]
    assert read == waiting[0] and read.answered_at - read.at >= 0.9   # the server's 1 s, as timed by the relay
    assert waiting[0].answered_at is None                             # a snapshot is not changed afterwards


def test_a_command_past_the_record_or_on_an_untracked_connection_has_no_answer_time(backend):
    with RecordingProxy(backend.address, max_commands=3) as small:
        r = through(small, single_connection_client=True)
        for _ in range(5):
            r.ping()
        assert len(small.commands()) == 3 and all(c.answered_at is not None for c in small.commands())
    with RecordingProxy(backend.address) as relay:
        raw = socket.create_connection(relay.address)
        raw.sendall(resp("CLIENT", "REPLY", "OFF") + resp("SET", "k", "v") + resp("CLIENT", "REPLY", "ON"))
        recv_exactly(raw, b"+OK\r\n")
        raw.close()
        assert [c.answered_at for c in relay.commands() if c.name == "SET"] == [None]


@pytest.mark.parametrize("protocol", [2, 3])
def test_pubsub_connection_does_not_disturb_tracking(backend, proxy, protocol):
    subscriber = through(proxy, protocol=protocol).pubsub()
    try:
        subscriber.subscribe("news")
        confirmation = subscriber.get_message(timeout=WAIT)
        assert confirmation and confirmation["type"] == "subscribe"
        through(proxy, protocol=protocol).publish("news", "hello")
        message = subscriber.get_message(timeout=WAIT)
        assert message and message["data"] == b"hello"
        assert proxy.pending() == []
        assert_blpop_tracked(proxy, through(proxy, protocol=protocol, single_connection_client=True),
                             backend.direct())
    finally:
        subscriber.close()


def test_resp3_pubsub_keeps_tracking_the_connection(private_redis_server):
    """Real Redis sends RESP3 subscribe confirmations and messages as push messages, which are not replies."""
    with RecordingProxy((private_redis_server.host, private_redis_server.port)) as proxy:
        direct = redis.Redis(host=private_redis_server.host, port=private_redis_server.port, socket_timeout=WAIT)
        with socket.create_connection(proxy.address, timeout=2 * BLOCK) as sock:
            sock.sendall(resp("HELLO", 3))
            assert recv_values(sock, 1).startswith(b"%")
            sock.sendall(resp("SUBSCRIBE", "a", "b"))
            assert recv_values(sock, 2).startswith(b">3\r\n$9\r\nsubscribe")
            assert proxy.pending() == []
            direct.publish("a", "hi")
            assert recv_values(sock, 1) == b">3\r\n$7\r\nmessage\r\n$1\r\na\r\n$2\r\nhi\r\n"
            sock.sendall(resp("PING") + resp("UNSUBSCRIBE"))
            recv_values(sock, 3)  # +PONG and two unsubscribe pushes
            sock.sendall(resp("BLPOP", "q", BLOCK))
            blocked = wait_until(proxy.pending, "the BLPOP to show as pending")
            assert blocked[0].args == (b"BLPOP", b"q", str(BLOCK).encode())
            direct.rpush("q", "v")
            recv_exactly(sock, b"*2\r\n$1\r\nq\r\n$1\r\nv\r\n")
            assert proxy.pending() == []
        direct.close()


def test_client_reply_off_is_relayed(backend, proxy):
    with socket.create_connection(proxy.address, timeout=WAIT) as sock:
        sock.sendall(resp("CLIENT", "REPLY", "OFF") + resp("SET", "a", "1") + resp("CLIENT", "REPLY", "ON"))
        recv_exactly(sock, b"+OK\r\n")
        sock.sendall(resp("EXISTS", "a"))
        recv_exactly(sock, b":1\r\n")
    assert proxy.pending() == []
    assert [c.name for c in proxy.commands()] == ["CLIENT", "SET", "CLIENT", "EXISTS"]


def test_inline_commands(private_redis_server):
    """As typed into telnet (fakeredis' TCP server does not take inline commands)."""
    with RecordingProxy((private_redis_server.host, private_redis_server.port)) as proxy:
        with socket.create_connection(proxy.address, timeout=WAIT) as sock:
            sock.sendall(b'SET greeting "hello world"\r\nGET greeting\r\n\r\n  \r\n'
                         b'DEL q\nRPUSH q a \'b c\' "\\x41\\n"\r\n')
            recv_exactly(sock, b"+OK\r\n$11\r\nhello world\r\n:0\r\n:3\r\n")
            assert proxy.pending() == []
        assert [c.args for c in proxy.commands()] == [
            (b"SET", b"greeting", b"hello world"), (b"GET", b"greeting"), (b"DEL", b"q"),
            (b"RPUSH", b"q", b"a", b"b c", b"A\n")]


INLINE_LINES = [
    b"plain words here",
    b"  spaced\t\tout  ",
    b'"hello world" x',
    b'"\\x41\\x4a\\n\\t\\"q\\z"',
    b"'it\\'s' \"\" ''",
    b"\\x41 unquoted\\n",
    b"a\x0bb c",
    b"\x0c lead",
]


def test_inline_splitting_matches_redis(private_redis_server):
    """Differential: Redis' own split of each line (read back from a list) equals the recorded arguments."""
    host, port = private_redis_server.host, private_redis_server.port
    with RecordingProxy((host, port)) as proxy, redis.Redis(host=host, port=port, socket_timeout=WAIT) as direct:
        with socket.create_connection(proxy.address, timeout=WAIT) as sock:
            for index, line in enumerate(INLINE_LINES):
                key = f"inline-{index}"
                sock.sendall(b"RPUSH " + key.encode() + b" " + line + b"\r\n")
                assert recv_values(sock, 1).startswith(b":")
                recorded = proxy.commands()[-1].args
                assert recorded[:2] == (b"RPUSH", key.encode())
                assert list(recorded[2:]) == direct.lrange(key, 0, -1), line
                assert list(recorded[2:]) == split_inline(line)


def test_inline_split_errors():
    for line in (b'"a"b', b'"unterminated', b"'unterminated", b'a"b"c', b"'a'b"):
        assert split_inline(line) is None, line
    assert split_inline(b"") == []
    assert split_inline(b"   ") == []


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli is not installed")
def test_redis_cli(private_redis_server):
    with RecordingProxy((private_redis_server.host, private_redis_server.port)) as proxy:
        out = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(proxy.address[1]), "RPUSH", "cli", "a b", "c"],
                             capture_output=True, text=True, timeout=WAIT, check=True).stdout
        assert out.strip() == "(integer) 2" or out.strip() == "2"
        assert [c.args for c in proxy.commands() if c.name == "RPUSH"] == [(b"RPUSH", b"cli", b"a b", b"c")]


# -- the parsers on their own -----------------------------------------------------------------------------------------

def test_command_value_object():
    command = Command(1, 2, 3.0, (b"rpush", b"q", b"x"), False)
    assert command.name == "RPUSH"
    assert Command(1, 2, 3.0, (), False).name == ""
    assert Command(1, 2, 3.0, (b"\xe9cho",), False).name == "\xc9CHO"
    with pytest.raises(FrozenInstanceError):
        command.seq = 5


def _random_command_stream(rng: random.Random, max_arg: int):
    """A client stream of RESP and inline commands, and the (args, truncated) pairs it must parse into."""
    chunks, expected = [], []
    for _ in range(rng.randrange(1, 40)):
        kind = rng.random()
        if kind < 0.7:
            args = [rng.choice([b"", b"\r\n", b"*", b"$3\r\n", rng.randbytes(rng.randrange(0, 3 * max_arg + 5))])
                    for _ in range(rng.randrange(1, 6))]
            chunks.append(resp(*args))
            expected.append((tuple(a[:max_arg] for a in args), any(len(a) > max_arg for a in args)))
        elif kind < 0.9:
            words = [bytes(rng.choice(b"abcXYZ019-_:") for _ in range(rng.randrange(1, 2 * max_arg + 3)))
                     for _ in range(rng.randrange(1, 5))]
            chunks.append(b" ".join(words) + rng.choice([b"\r\n", b"\n"]))
            expected.append((tuple(w[:max_arg] for w in words), any(len(w) > max_arg for w in words)))
        else:
            chunks.append(rng.choice([b"*0\r\n", b"*-1\r\n", b"\r\n", b"\n", b"   \r\n"]))  # no command at all
    return b"".join(chunks), expected


@pytest.mark.parametrize("seed", range(30))
def test_command_parser_does_not_depend_on_how_the_stream_is_cut(seed):
    rng = random.Random(seed)
    max_arg = rng.choice([0, 1, 8, 64])
    stream, expected = _random_command_stream(rng, max_arg)
    for cut in ("whole", "random", "bytewise"):
        parser, out, pos = CommandParser(max_arg), [], 0
        while pos < len(stream):
            step = {"whole": len(stream), "random": rng.randrange(1, 40), "bytewise": 1}[cut]
            parser.feed(stream[pos:pos + step], out)
            pos += step
        assert out == expected, cut


@pytest.mark.parametrize("seed", range(20))
def test_parsers_fail_only_by_declaring_confusion(seed):
    rng = random.Random(seed)
    junk = rng.randbytes(rng.randrange(1, 5000))
    junk = rng.choice([b"", b"*", b"$", b"*2\r\n", b"%1\r\n", b"|1\r\n"]) + junk
    for parser_factory, feed in ((lambda: CommandParser(16), lambda p, d: p.feed(d, [])),
                                 (ReplyParser, lambda p, d: p.feed(d))):
        parser = parser_factory()
        try:
            for start in range(0, len(junk), 97):
                feed(parser, junk[start:start + 97])
        except ProtocolConfusion:
            pass


@pytest.mark.parametrize("line", [b"*abc\r\n", b"*2\r\n$-5\r\n", b"*1\r\nXYZ\r\n", b"*01\r\n", b'"a\r\n',
                                  b"*1\r\n$600000000\r\n", b"ab\x00cd\r\n"])
def test_command_parser_declares_what_redis_rejects(line):
    with pytest.raises(ProtocolConfusion):
        CommandParser(16).feed(line, [])


REPLIES = [  # (bytes, type of the reply, or None for a push message)
    (b"+OK\r\n", "+"),
    (b"-ERR wrong\r\n", "-"),
    (b":42\r\n", ":"),
    (b"$5\r\nhello\r\n", "$"),
    (b"$10\r\nab\r\ncd\r\nef\r\n", "$"),
    (b"$0\r\n\r\n", "$"),
    (b"$-1\r\n", "$"),
    (b"*-1\r\n", "*"),
    (b"*0\r\n", "*"),
    (b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n", "*"),
    (b"_\r\n", "_"),
    (b",3.14\r\n", ","),
    (b"#t\r\n", "#"),
    (b"(12345678901234567890123\r\n", "("),
    (b"!3\r\nerr\r\n", "!"),
    (b"=8\r\ntxt:abcd\r\n", "="),
    (b"%2\r\n+k\r\n:1\r\n+k2\r\n*0\r\n", "%"),
    (b"%0\r\n", "%"),
    (b"~2\r\n+a\r\n+b\r\n", "~"),
    (b">3\r\n+message\r\n+ch\r\n$2\r\nhi\r\n", None),
    (b"|1\r\n+ttl\r\n:3600\r\n$3\r\nval\r\n", "$"),  # an attribute, then the reply it annotates
    (b"*2\r\n|1\r\n+a\r\n%1\r\n+b\r\n:2\r\n:1\r\n:2\r\n", "*"),  # an attribute inside an aggregate
    (b">2\r\n+invalidate\r\n*1\r\n$1\r\nk\r\n", None),
    (b"+" + b"x" * 200_000 + b"\r\n", "+"),  # a long line is skipped, not buffered
    (b"$200000\r\n" + b"y" * 200_000 + b"\r\n", "$"),
]


@pytest.mark.parametrize("seed", range(10))
def test_reply_parser_counts_replies_but_not_pushes_or_attributes(seed):
    rng = random.Random(seed)
    sample = rng.sample(REPLIES, len(REPLIES))
    stream = b"".join(data for data, _ in sample)
    expected = [ord(t) for _, t in sample if t]
    for step in (len(stream), 1 if seed == 0 else rng.randrange(1, 50)):
        parser, types, values = ReplyParser(), [], 0
        for start in range(0, len(stream), step):
            got, count = parser.feed(stream[start:start + step])
            types += got
            values += count
            assert len(parser._buf) <= _HEADER_MAX
        assert types == expected
        assert values == len(sample)


@pytest.mark.parametrize("data", [b"?3\r\n", b"*-2\r\n", b"$abc\r\n", b"$" + b"9" * 100, b"$-2\r\n", b"%-1\r\n"])
def test_reply_parser_declares_what_is_not_resp(data):
    with pytest.raises(ProtocolConfusion):
        ReplyParser().feed(data)


def test_passwords_are_not_recorded(backend, proxy):
    with socket.create_connection(proxy.address, timeout=WAIT) as sock:
        sock.sendall(resp("AUTH", "s3cret-one") + resp("AUTH", "alice", "s3cret-two")
                     + resp("HELLO", 2, "AUTH", "bob", "s3cret-three", "SETNAME", "w") + resp("PING"))
        wait_until(lambda: len(proxy.commands()) == 4 and not proxy.pending(), "every reply")
    recorded = [c.args for c in proxy.commands()]
    assert recorded == [(b"AUTH", REDACTED), (b"AUTH", b"alice", REDACTED),
                        (b"HELLO", b"2", b"AUTH", b"bob", REDACTED, b"SETNAME", b"w"), (b"PING",)]


# -- intercept --------------------------------------------------------------------------------------------------------

class _Guard:
    """Refuses CONFIG, answers TIME with a fixed instant, forwards SELECT 0 and refuses any other SELECT."""
    names = (b"CONFIG", b"TIME", b"SELECT")

    def __init__(self):
        self.asked: list[tuple[bytes, ...]] = []

    def __call__(self, args):
        self.asked.append(args)
        name = args[0].upper()
        if name == b"CONFIG":
            return intercepts.refusal("retrylab: CONFIG is not available to learner code")
        if name == b"TIME":
            return intercepts.time_answer(1_700_000_000.25)
        if name == b"SELECT" and args[1:] != (b"0",):
            return intercepts.refusal("retrylab: only database 0")
        return None


@pytest.fixture
def guarded(backend):
    guard = _Guard()
    with RecordingProxy(backend.address, intercept=guard) as proxy:
        yield proxy, guard


@pytest.mark.parametrize("protocol", [2, 3])
def test_intercept_refuses_and_answers_in_order_in_a_pipeline(backend, guarded, protocol):
    proxy, guard = guarded
    with through(proxy, protocol=protocol) as r:
        with r.pipeline(transaction=False) as pipe:
            pipe.set("a", "1").config_get("port").time().get("a").execute_command("SELECT", "3")
            pipe.execute_command("SELECT", "0").incr("a")
            replies = pipe.execute(raise_on_error=False)
        assert replies[0] is True
        assert isinstance(replies[1], redis.ResponseError)
        assert "CONFIG is not available to learner code" in str(replies[1])
        assert replies[2] == (1_700_000_000, 250_000)
        assert replies[3] == b"1"
        assert isinstance(replies[4], redis.ResponseError) and "only database 0" in str(replies[4])
        assert replies[5] in (True, b"OK", "OK")
        assert replies[6] == 2
        with pytest.raises(redis.ResponseError, match="CONFIG is not available"):
            r.config_get("port")
        assert r.time() == (1_700_000_000, 250_000)
    # recorded as the learner sent them, not as rewritten
    names = [c.name for c in proxy.commands() if c.name not in HANDSHAKE - {"SELECT"}]
    assert names == ["SET", "CONFIG", "TIME", "GET", "SELECT", "SELECT", "INCRBY", "CONFIG", "TIME"]
    assert proxy.pending() == []


@pytest.mark.parametrize("protocol", [2, 3])
def test_intercept_inside_multi_exec(backend, guarded, protocol):
    proxy, _ = guarded
    with through(proxy, protocol=protocol) as r:
        with r.pipeline(transaction=True) as pipe:
            pipe.set("k", "v").config_set("requirepass", "x").time().get("k")
            replies = pipe.execute(raise_on_error=False)
        assert replies[0] is True
        assert isinstance(replies[1], redis.ResponseError) and "CONFIG" in str(replies[1])
        assert replies[2] == (1_700_000_000, 250_000)
        assert replies[3] == b"v"
        with backend.direct() as d:
            assert d.get("k") == b"v"
            if backend.kind == "real":
                assert d.config_get("requirepass") == {"requirepass": ""}
    assert proxy.pending() == []


def test_intercept_with_a_command_split_into_single_bytes(backend, guarded):
    """A command cut anywhere (here one byte per send) is held until complete, then rewritten; the order holds."""
    proxy, guard = guarded
    stream = resp("SET", "x", "1") + resp("CONFIG", "GET", "port") + resp("TIME") + resp("GET", "x")
    with socket.create_connection(proxy.address) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(stream)):
            sock.sendall(stream[i:i + 1])
        data = recv_values(sock, 4)
    # fakeredis puts "ERR " in front of a script's error reply; Redis 7 does not
    assert data.replace(b"-ERR ", b"-").startswith(b"+OK\r\n-retrylab: CONFIG is not available to learner code\r\n")
    assert b"*2\r\n$10\r\n1700000000\r\n$6\r\n250000\r\n" in data
    assert [a[0] for a in guard.asked] == [b"CONFIG", b"TIME"]


def test_intercept_streams_other_commands_and_bounds_what_it_holds(backend, guarded):
    proxy, guard = guarded
    big = os.urandom(3 << 20)
    with through(proxy) as r:
        r.set("big", big)                                   # not intercepted: streamed, byte for byte
        assert r.get("big") == big
        with pytest.raises(redis.ResponseError, match="too long for the relay"):
            r.execute_command("CONFIG", "SET", "x", big)    # intercepted and longer than the relay holds
        assert r.ping()
    assert guard.asked == []                                # the oversize one never reached the intercept


def test_intercept_closes_a_connection_it_cannot_parse(backend, guarded):
    proxy, _ = guarded
    with socket.create_connection(proxy.address) as sock:
        sock.sendall(resp("PING") + b"*2\r\n$x\r\n")
        data = recv_until_eof(sock)
    assert data == b"+PONG\r\n"


def test_intercept_keeps_blpop_tracking(backend, guarded):
    proxy, _ = guarded
    with through(proxy) as client, backend.direct() as pusher:
        assert_blpop_tracked(proxy, client, pusher)


def test_a_broken_intercept_refuses_rather_than_forwards(backend):
    class Broken:
        names = (b"CONFIG",)

        def __call__(self, args):
            raise RuntimeError("bug")
    with RecordingProxy(backend.address, intercept=Broken()) as proxy, through(proxy) as r:
        with pytest.raises(redis.ResponseError, match="could not judge"):
            r.config_get("port")


def test_command_parser_reports_where_commands_end():
    stream = resp("SET", "a", "1") + b"PING\r\n" + b"*0\r\n" + resp("GET", "a" * 100)
    for cut in range(1, 12):
        parser, out, ends = CommandParser(8), [], []
        for i in range(0, len(stream), cut):
            parser.feed(stream[i:i + cut], out, ends)
        first = len(resp("SET", "a", "1"))
        assert ends == [first, first + 6, len(stream)]
        assert [a[0] for a, _ in out] == [b"SET", b"PING", b"GET"]


def test_chained_intercepts_each_see_their_own_commands(backend):
    class Clock:
        names = (b"time",)

        def __call__(self, args):
            return intercepts.time_answer(42.5)
    guard = _Guard()
    with RecordingProxy(backend.address, intercept=intercepts.chain(Clock(), guard)) as proxy, through(proxy) as r:
        assert r.time() == (42, 500_000)          # the first intercept that names TIME answers it
        with pytest.raises(redis.ResponseError, match="CONFIG is not available"):
            r.config_get("port")
        assert r.set("k", "v")
    assert [a[0] for a in guard.asked] == [b"CONFIG"]


def test_an_interrupt_in_a_listeners_start_leaves_close_working(fake_server, tmp_path, monkeypatch):
    """A Ctrl-C landing in serve_unix's Thread.start(), after the thread was listed for close(): close() must not
    fail on the thread that never started (an interrupted grading would report a harness error)."""
    relay = RecordingProxy(("127.0.0.1", fake_server.server_address[1])).start()
    real_start = threading.Thread.start

    def interrupted(self):
        raise KeyboardInterrupt
    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        relay.serve_unix(tmp_path / "redis.sock")
    monkeypatch.setattr(threading.Thread, "start", real_start)
    relay.close()                                   # no RuntimeError("cannot join thread before it is started")


def test_joining_a_thread_that_never_started_returns_at_once():
    thread = threading.Thread(target=time.sleep, args=(60,))
    started = time.monotonic()
    background.join_all([thread], 5)
    assert time.monotonic() - started < 1 and not thread.is_alive()
