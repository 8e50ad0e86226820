"""The application channel (retrylab.appchannel): the harness decides and records every call of an
exercise's instrumented module; raw, forged or malformed requests are recorded as what they are,
never as a call the learner made up; the run's clock is the harness's."""
from __future__ import annotations

import json
import math
import os
import socket
import struct
import threading
import time

import pytest

from retrylab import procfs
from retrylab.appchannel import ARG_TEXT_LIMIT, ID_LIMIT, MAX_FRAME, AppChannel, describe_call_limit
from retrylab.calllog import BYTES, CALLS, MALFORMED, RecordLimit
from retrylab.fixtures.backoff_dlq import message_factory, taskproc
from retrylab.fixtures.backoff_dlq.taskproc_app import TaskprocApp
from retrylab.learner_site import appstub

from helpers import wait_until


@pytest.fixture
def seeded():
    return [message_factory.new_message("good"), message_factory.new_message("bad")]


@pytest.fixture
def channel(tmp_path, seeded, monkeypatch):
    with AppChannel(tmp_path / "app.sock", TaskprocApp(seeded=seeded), max_calls=50) as channel:
        monkeypatch.setenv(appstub.SOCKET_VARIABLE, str(channel.path))
        yield channel
        appstub.disconnect()


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _raw(channel, data: bytes, *, reply: bool = True):
    """Send raw bytes on a connection of our own; the decoded reply (None: none, or closed)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(channel.path))
        sock.sendall(data)
        if not reply:
            sock.shutdown(socket.SHUT_WR)
            sock.recv(1)
            return None
        try:    # a socket with a timeout may return part of MSG_WAITALL's bytes: read them all
            (length,) = struct.unpack(">I", appstub._recv_exactly(sock, 4))
        except appstub.ChannelClosed:
            return None
        return json.loads(appstub._recv_exactly(sock, length))


def _call(message, **extra) -> bytes:
    request = {"op": "call", "fn": "process", "pid": 1, "args": [appstub.describe(message)], **extra}
    return _frame(json.dumps(request).encode())


def test_the_stub_returns_or_raises_what_the_harness_decided(channel, seeded):
    good, bad = seeded
    assert taskproc.process(good) == {"id": good["id"], "status": "done"}
    with pytest.raises(taskproc.TaskRejected, match=f"task {bad['id']}: kind=bad is rejected"):
        taskproc.process(bad)
    with pytest.raises(TypeError, match="got bytes"):
        taskproc.process(json.dumps(good).encode())
    assert [(c.id, c.outcome, c.altered) for c in channel.calls()] == [
        (good["id"], "ok", None), (bad["id"], "error", None), (None, "error", None)]


def test_a_queued_message_fails_by_the_kind_it_was_queued_with(channel, seeded):
    bad = dict(seeded[1], kind="good")
    with pytest.raises(taskproc.TaskRejected):
        taskproc.process(bad)
    data_changed = dict(seeded[0], data={"order": -1})
    taskproc.process({"attempts": 3, "payload": data_changed})    # an envelope: judged by its payload
    assert [(c.outcome, c.altered) for c in channel.calls()] == [("error", "kind"), ("ok", "data")]


def test_a_request_claiming_its_own_outcome_is_decided_by_the_harness(channel, seeded):
    reply = _raw(channel, _call(seeded[1], outcome="ok", error=None, error_class=None))
    assert reply["error"]["class"] == "TaskRejected"
    (call,) = channel.calls()
    assert (call.id, call.outcome, call.error_class) == (seeded[1]["id"], "error", "TaskRejected")


def test_a_call_carries_how_long_the_process_that_connected_waited_for_a_cpu_whatever_pid_it_states(
        channel, seeded, monkeypatch):
    """The kernel's pid of the connection (SO_PEERCRED) is asked, not the pid the request states (1 here)."""
    asked = []
    monkeypatch.setattr(procfs, "cpu_wait", lambda pid: asked.append(pid) or 0.25)
    _raw(channel, _call(seeded[0]))
    (call,) = channel.calls()
    assert asked == [os.getpid()] and call.pid == 1 and call.peer == os.getpid()
    assert call.cpu_wait >= 0.25       # the process's wait, the harness thread's and the machine's steal


def test_a_call_whose_process_the_kernel_cannot_tell_carries_no_cpu_wait(channel, seeded, monkeypatch):
    monkeypatch.setattr(procfs, "cpu_wait", lambda pid: None)
    _raw(channel, _call(seeded[0]))
    assert channel.calls()[0].cpu_wait is None


def test_procfs_reads_waits_for_a_cpu_from_the_kernel():
    assert procfs.cpu_wait(os.getpid()) >= 0.0 and procfs.own_cpu_wait() >= 0.0 and procfs.steal() >= 0.0
    assert procfs.cpu_wait(2 ** 22 + 1) is None       # no such process (pid_max is at most 2**22)


@pytest.mark.parametrize("data, problem", [
    (_frame(b"\xff\xfe garbage"), "not_json"),
    (_frame(b"[1, 2, 3]"), "not_request"),
    (_frame(json.dumps({"op": "record", "id": "x", "outcome": "ok"}).encode()), "not_request"),
    (_frame(json.dumps({"op": "call", "fn": "process", "args": "x"}).encode()), "bad_arguments"),
    (_frame(json.dumps({"op": "call", "fn": "process", "args": [{"text": 1}]}).encode()), "bad_arguments"),
    (_frame(json.dumps({"op": "call", "fn": "os.system", "args": []}).encode()), "unknown_function"),
    (_frame(json.dumps({"op": "advance", "seconds": "NaN"}).encode()), "bad_seconds"),
    (_frame(b'{"op": "advance", "seconds": NaN}'), "bad_seconds"),
    (_frame(b'{"op": "advance", "seconds": Infinity}'), "bad_seconds"),     # the run's clock out of any date's range
    (_frame(json.dumps({"op": "advance", "seconds": 1e300}).encode()), "bad_seconds"),
    (_frame(json.dumps({"op": "advance", "seconds": 10 ** 400}).encode()), "bad_seconds"),
    (_frame(json.dumps({"op": "advance", "seconds": -10 ** 400}).encode()), "bad_seconds"),
    (struct.pack(">I", MAX_FRAME + 1) + b"x" * 100, "oversized"),
    (b"\xff\xff\xff\xff" + b"random bytes", "oversized"),
])
def test_a_malformed_request_is_answered_and_recorded_as_malformed(channel, data, problem):
    reply = _raw(channel, data)
    assert reply["error"]["class"] == "ValueError"
    (call,) = channel.calls()
    assert (call.outcome, call.error, call.id) == (MALFORMED, problem, None)


def test_a_half_request_is_recorded_when_its_connection_closes(channel):
    _raw(channel, _call({"id": "a", "kind": "good"})[:20], reply=False)
    wait_until(channel.calls, "the half request to be recorded", timeout=1)
    (call,) = channel.calls()
    assert (call.outcome, call.error) == (MALFORMED, "unfinished")


def test_a_list_as_id_is_an_ordinary_call_with_no_id(channel):
    assert taskproc.process({"id": [1, 2], "kind": "good"}) == {"id": None, "status": "done"}
    (call,) = channel.calls()
    assert (call.id, call.outcome, call.is_dict) == (None, "ok", True)


def test_more_calls_than_the_limit_are_refused_and_not_kept(channel):
    for n in range(50):
        taskproc.process({"id": f"m{n}", "kind": "good"})
    assert not channel.over_limit
    with pytest.raises(RuntimeError, match="more than 50 calls"):
        taskproc.process({"id": "one-too-many", "kind": "good"})
    assert channel.over_limit and len(channel.calls()) == 50


def test_a_huge_argument_is_bounded_on_both_sides(channel):
    with pytest.raises(ValueError, match="not bulk data"):
        taskproc.process({"id": "big", "kind": "good", "blob": "x" * (10 << 20)})
    (call,) = channel.calls()
    assert len(call.arg) <= 4096 and call.outcome == "error"


def test_sleeping_moves_the_runs_clock_and_every_reply_carries_it(channel):
    offsets = []
    appstub.on_offset = offsets.append
    try:
        appstub.request({"op": "advance", "seconds": 12.5})
        appstub.request({"op": "advance", "seconds": -3})     # never backwards
        appstub.request({"op": "advance", "seconds": 1e300})  # bounded
        taskproc.process({"id": "a", "kind": "good"})
    finally:
        appstub.on_offset = None
    assert offsets[:2] == [12.5, 12.5] and math.isfinite(offsets[2]) and offsets[3] == offsets[2] + 1
    assert channel.clock.offset == offsets[3]
    assert abs(channel.clock.now() - (channel.clock.offset + time.time())) < 1


def test_every_malformed_request_is_described_in_every_language():
    import re
    from pathlib import Path

    from retrylab import appchannel, i18n
    source = Path(appchannel.__file__).read_text(encoding="utf-8")
    codes = set(re.findall(r'ChannelError\("(\w+)"\)', source)) | set(re.findall(r'malformed\("(\w+)"', source))
    assert codes >= {"unfinished", "oversized", "not_json", "not_request", "bad_seconds", "unknown_function",
                     "bad_arguments"}
    for lang in i18n.LANGUAGES:
        for code in codes:
            assert i18n.label(f"channel.malformed.{code}", lang).strip()


def _raw_call(message: dict) -> bytes:
    """A call as a raw client may send it: the argument whole (the stub would cut it at 32 KiB)."""
    arg = {"json": json.dumps(message), "type": "dict", "truncated": False}
    return _frame(json.dumps({"op": "call", "fn": "process", "pid": 1, "args": [arg]}).encode())


def test_a_huge_id_is_recorded_cut_distinct_and_never_as_the_seeded_id_it_starts_with(channel, seeded):
    bad = seeded[1]
    long_ids = [bad["id"] + "x" * 120_000, bad["id"] + "x" * 119_999 + "y"]
    replies = [_raw(channel, _raw_call({"id": i, "kind": "good"})) for i in long_ids]
    calls = channel.calls()
    assert [r.get("error") for r in replies] == [None, None]      # judged by its own kind: not the seeded one
    assert [r["value"]["id"] for r in replies] == long_ids         # the reply is whole
    assert len({c.id for c in calls}) == 2 and bad["id"] not in {c.id for c in calls}
    assert all(ID_LIMIT < len(c.id) < ID_LIMIT + 120 and "sha256" in c.id for c in calls)
    assert all(c.altered is None for c in calls)


def test_an_error_quoting_a_huge_id_is_cut_alike_in_the_record_and_the_reply(channel):
    reply = _raw(channel, _raw_call({"id": "z" * 120_000, "kind": "bad"}))
    (call,) = channel.calls()
    assert len(call.error) <= ARG_TEXT_LIMIT and call.error.endswith("characters]")
    assert reply["error"]["message"] == call.error and reply["error"]["class"] == "TaskRejected"


def test_the_records_byte_budget_stops_the_run_with_its_own_message(tmp_path, monkeypatch):
    with AppChannel(tmp_path / "app.sock", TaskprocApp(), max_record_bytes=256 << 10) as channel:
        replies = [_raw(channel, _raw_call({"id": f"{n}-" + "w" * 100_000, "kind": "bad"})) for n in range(60)]
        assert channel.over_limit and channel.exceeded == RecordLimit(BYTES, 256 << 10)
        assert 10 < len(channel.calls()) < 60 and channel.record.bytes <= 256 << 10
        assert "more than 262144 bytes of call records" in replies[-1]["error"]["message"]
        assert "0.25 MB" in describe_call_limit("worker.py", channel.exceeded)
        assert "10000 calls" in describe_call_limit("worker.py", RecordLimit(CALLS, 10_000))


def test_a_reply_larger_than_the_socket_takes_waits_and_a_client_not_reading_only_holds_itself_back(channel):
    big_ids = [f"{n}-" + "r" * 100_000 for n in range(40)]      # 4 MB of replies, far over the buffers
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(channel.path))
        sender = threading.Thread(target=sock.sendall,
                                  args=(b"".join(_raw_call({"id": i, "kind": "good"}) for i in big_ids),))
        sender.start()
        recorded, deadline = 0, time.monotonic() + 20
        while time.monotonic() < deadline:      # until the channel stops reading this connection
            time.sleep(0.3)
            now = len(channel.calls())
            if now and now == recorded:
                break
            recorded = now
        assert 0 < recorded < len(big_ids)
        assert taskproc.process({"id": "another-client", "kind": "good"})["id"] == "another-client"
        for expected in big_ids:
            (length,) = struct.unpack(">I", appstub._recv_exactly(sock, 4))
            assert json.loads(appstub._recv_exactly(sock, length))["value"]["id"] == expected
        sender.join(timeout=30)
    assert len(channel.calls()) == len(big_ids) + 1
