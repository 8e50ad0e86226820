"""A grading forked from grade-batch's warm process (which has imported fakeredis: Broker.grading_warm_imports)
forks its fake Redis server instead of starting an interpreter for it. The forked server serves, runs as an
unprivileged uid of its own in a session of its own, holds none of the grading's descriptors, and dies with the
grading; a process with other threads (a C library's too), or with warm start turned off, still starts a new
interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import alive, wait_until
from retrylab.brokers.redis import BROKER, fake_server_process

REFERENCE = Path(__file__).resolve().parents[1] / "solution" / "backoff-dlq"

# In a fresh interpreter with a single thread (a pytest worker has several): start a FakeServerProcess, ask it for a
# server, and say what the server process is.
SCRIPT = r"""
import json, os, sys, threading, time
import {warm}
from retrylab.brokers.redis.fake_server_process import FakeServerProcess
if {threads} == "python":
    threading.Thread(target=threading.Event().wait, daemon=True).start()
elif {threads} == "native":                          # as a C library starts one: threading does not count it
    import _thread
    hold = _thread.allocate_lock(); hold.acquire()
    _thread.start_new_thread(hold.acquire, ())
    while len(os.listdir("/proc/self/task")) < 2: time.sleep(0.01)
    assert threading.active_count() == 1
keep = open(os.devnull)                              # a descriptor of the grading's that the server must not hold
def descriptors(pid):   # a new interpreter may still be importing: a file it opened can close before its readlink
    found = {{}}
    for fd in os.listdir(f"/proc/{{pid}}/fd"):
        try:
            found[fd] = os.readlink(f"/proc/{{pid}}/fd/{{fd}}")
        except FileNotFoundError:
            pass
    return found
servers = FakeServerProcess().start()
port = servers.new_server()
import redis
pong = redis.Redis(port=port).ping()
pid = servers.pid
with open(f"/proc/{{pid}}/status") as f:
    status = dict(line.rstrip("\n").split(":\t", 1) for line in f)
uid = int(status["Uid"].split()[0])
sigpipe_ignored = bool(int(status["SigIgn"], 16) & (1 << (13 - 1)))
print(json.dumps({{"kind": type(servers._proc).__name__, "pid": pid, "pong": pong, "uid": uid, "sigpipe_ignored": sigpipe_ignored,
                  "sid": os.getsid(pid), "fds": descriptors(pid),
                  "exe_is_ours": os.readlink(f"/proc/{{pid}}/exe") == os.readlink("/proc/self/exe"),
                  "cmdline_is_ours": open(f"/proc/{{pid}}/cmdline").read() == open("/proc/self/cmdline").read()}}),
      flush=True)
if {again}:
    os.kill(pid, 9); time.sleep(0.2)                 # the server ended (a learner's memory bomb, say)
    try:
        servers.new_server()                         # says so, and lets it go
    except Exception as exc:
        assert "ended" in str(exc), exc
    port = servers.new_server()                      # the next one asked for
    print(json.dumps({{"kind": type(servers._proc).__name__, "pong": redis.Redis(port=port).ping(),
                      "cmdline_is_ours": open(f"/proc/{{servers.pid}}/cmdline").read() == open("/proc/self/cmdline").read()}}),
          flush=True)
if {stop}:
    servers.stop()
    print(json.dumps({{"alive_after_stop": os.path.exists(f"/proc/{{pid}}")}}), flush=True)
else:
    sys.stdin.read()                                 # until the test kills us
"""


def _run(*, threads="", stop=True, again=False, env=None):
    script = SCRIPT.format(warm=", ".join(BROKER.grading_warm_imports), threads=repr(threads), stop=stop, again=again)
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def test_a_single_threaded_warm_grading_forks_a_contained_server_that_stops_with_it():
    proc = _run()
    out, err = proc.communicate(timeout=60)
    first, second = (json.loads(line) for line in out.splitlines())
    assert first["kind"] == "ForkedServer" and first["pong"] is True, err
    # as in any Python process: a client gone mid-reply (a learner's process killed) is an error on that connection,
    # not SIGPIPE's default action, which killed the server and every later check of the grading
    assert first["sigpipe_ignored"] is True
    assert first["cmdline_is_ours"], "a fork: no new interpreter started"
    assert first["sid"] == first["pid"], "a session of its own"
    low, high = fake_server_process.UID_RANGE
    if os.geteuid() == 0:
        assert low <= first["uid"] < high, "serves as an unprivileged uid"
    held = {int(fd): target for fd, target in first["fds"].items()}
    assert "/dev/null" not in [target for fd, target in held.items() if fd > 2], held   # not the grading's
    # its sockets, and its answer pipe (a copy of fd 1, which then goes to /dev/null): no file of the grading's
    assert not [target for fd, target in held.items() if fd > 2 and target.startswith("/")], held
    assert second == {"alive_after_stop": False}


def test_the_forked_server_dies_when_the_grading_is_killed():
    proc = _run(stop=False)
    line = proc.stdout.readline()
    server = json.loads(line)["pid"]
    assert alive(server)
    proc.kill()
    proc.wait(10)
    wait_until(lambda: not alive(server), "the forked fake server to die with the grading")


def test_with_other_threads_or_warm_start_off_the_server_is_a_new_interpreter():
    for options in ({"threads": "python"}, {"threads": "native"}, {"env": {"RETRYLAB_WARM_START": "0"}}):
        out, err = _run(**options).communicate(timeout=60)
        assert out.strip(), (options, err[-3000:])     # CI once saw no line at all here: say what the script said
        first = json.loads(out.splitlines()[0])
        assert first["kind"] == "Popen" and first["pong"] is True and first["sigpipe_ignored"] is True, (options, err)
        assert not first["cmdline_is_ours"], options


# `retrylab check` as far as its servers: the arguments parsed and validated, the backend started early; then what
# this process imported, and the command lines of its children (the fake server, the learner template)
CHECK_START = r"""
import json, os, sys, time
from retrylab import brokers, cli
from retrylab.commands import check
parser, _, _ = cli._parser()
args = parser.parse_args(["check", {solution!r}, "--backend", {backend!r}])
check.validate(args)
ours = open("/proc/self/cmdline").read()
def read(path):     # a thread or a child can end between its listing and this read
    try:
        with open(path) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
def children():   # of every thread: a child a thread started is listed under that thread while it lives
    listed = [pid for task in os.listdir("/proc/self/task")
              for pid in (read(f"/proc/self/task/{{task}}/children") or "").split()]
    return [c for c in (read(f"/proc/{{pid}}/cmdline") for pid in listed) if c is not None]
def settled(seen):   # the server (forked at once, or from a thread) and the learner template, each past its exec
    return any("learner_template" in c for c in seen) and ({backend!r} != "fake" or len(seen) >= 2)
deadline, before = time.monotonic() + 20, None
while time.monotonic() < deadline:
    time.sleep(0.1)
    now = sorted(children())
    if now == before and settled(now):   # the same twice: no child caught between its fork and its exec
        break
    before = now
children = before
print(json.dumps({{"warm_imported": all(m in sys.modules for m in {warm!r}),
                  "forked": sum(c == ours for c in children), "interpreters": [c for c in children if c != ours]}}))
brokers.stop_unused()
"""


def test_retrylab_check_forks_the_fake_server_from_itself_and_imports_nothing_for_a_real_server():
    """On the fake backend `retrylab check` imports the server's modules before any thread starts and forks the
    server (no second interpreter importing fakeredis); on redis-server it imports none of it."""
    seen = {}
    for backend in ("fake", "redis-server"):
        script = CHECK_START.format(solution=str(REFERENCE), backend=backend, warm=BROKER.grading_warm_imports)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        seen[backend] = json.loads(out.stdout)
    fake, real = seen["fake"], seen["redis-server"]
    assert fake["warm_imported"] and fake["forked"] == 1, fake
    assert not any("fake_server_process" in c for c in fake["interpreters"]), fake
    assert not real["warm_imported"] and real["forked"] == 0, real
    assert any("learner_template" in c for c in real["interpreters"]), real   # the children were seen at all


def test_a_fake_server_started_again_mid_grading_is_a_new_interpreter():
    """Only the first server of a grading is forked: one started again later (the last one ended) would copy the
    whole grading, its heap included."""
    out, err = _run(again=True).communicate(timeout=60)
    first, again = (json.loads(line) for line in out.splitlines()[:2])
    assert first["kind"] == "ForkedServer" and again["kind"] == "Popen" and again["pong"] is True, err
    assert not again["cmdline_is_ours"]


def test_waiting_for_a_forked_server_returns_when_it_ends_and_not_before():
    pid = os.fork()
    if pid == 0:                                     # the "server": ends by itself a moment later
        time.sleep(0.3)
        os._exit(3)
    with open(os.devnull, "wb") as stdin, open(os.devnull, "rb") as stdout:
        server = fake_server_process.ForkedServer(pid, stdin, stdout)
        with pytest.raises(subprocess.TimeoutExpired):
            server.wait(0.05)
        started = time.monotonic()
        assert server.wait(10) == 3
        assert time.monotonic() - started < 5        # woken by its end, not at the end of the limit
        assert server.wait(0) == 3                   # ended: answered at once, again
