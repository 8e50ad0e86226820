"""The learner process's environment: redirected Redis, taskproc's stub (decided by the harness), the run's virtual clock."""
from __future__ import annotations

import json
import time

import pytest

from retrylab.appchannel import RUN_CLOCK_LEAD, RunClock
from retrylab.brokers.redis.fake import FakeBackend
from retrylab.brokers.redis.server import RedisServerBackend
from retrylab.runner import LearnerRunner

APPLICATION = "retrylab.fixtures.backoff_dlq.taskproc_app:TaskprocApp"   # backoff-dlq's: `import taskproc` gives its stub

CONNECT_STYLES = {
    "default": "redis.Redis()",
    "host-port": "redis.StrictRedis(host='localhost', port=6379, decode_responses=True)",
    "from-url-env": "redis.Redis.from_url(os.environ['REDIS_URL'])",
    "from-url-literal": "redis.Redis.from_url('redis://:hunter2@db.example:6380/4')",
    "unix-socket": "redis.Redis(unix_socket_path='/var/run/redis/redis.sock')",
    "tls": "redis.Redis(host='localhost', port=6380, ssl=True)",
    "blocking-pool": "redis.Redis(connection_pool=redis.BlockingConnectionPool(host='10.0.0.1'))",
}


@pytest.fixture(params=["fake", "redis-server"])
def backend(request):
    backend = FakeBackend() if request.param == "fake" else RedisServerBackend()
    backend.start()
    yield backend
    backend.stop()


def _run(tmp_path, backend, code: str, run_clock: RunClock | None = None):
    folder = tmp_path / "submission"
    folder.mkdir(exist_ok=True)
    (folder / "script.py").write_text(code)
    with backend.private() as endpoint, endpoint.client() as client:
        run = LearnerRunner(folder, application=APPLICATION).run("script.py", endpoint, timeout=30, run_clock=run_clock)
        keys = {k: client.lrange(k, 0, -1) for k in client.keys("*")}
    return run, keys


@pytest.mark.parametrize("style", sorted(CONNECT_STYLES))
def test_every_connection_style_reaches_the_private_server(tmp_path, backend, style):
    code = f"import os, redis\nr = {CONNECT_STYLES[style]}\nr.rpush('seen', 'yes')\n"
    run, keys = _run(tmp_path, backend, code)
    assert run.result.returncode == 0, run.result.stderr
    assert keys == {b"seen": [b"yes"]}


def test_asyncio_client_is_redirected(tmp_path, backend):
    code = ("import asyncio, redis.asyncio as aredis\n"
            "async def main():\n    r = aredis.Redis(host='example.invalid', port=1)\n"
            "    await r.rpush('seen', 'async')\n    await r.aclose()\nasyncio.run(main())\n")
    run, keys = _run(tmp_path, backend, code)
    assert run.result.returncode == 0, run.result.stderr
    assert keys == {b"seen": [b"async"]}


def test_taskproc_is_the_instrumented_one_even_with_opt_app_on_the_path(tmp_path, backend):
    code = ("import sys\nsys.path.insert(0, '/opt/app')\nimport taskproc\n"
            "print(taskproc.process({'id': 'a', 'kind': 'good'}))\n"
            "try:\n    taskproc.process({'id': 'b', 'kind': 'bad'})\nexcept RuntimeError as e:\n    print('raised', e)\n")
    run, _ = _run(tmp_path, backend, code)
    assert "raised task b: kind=bad" in run.result.stdout, run.result.stderr
    assert [(c.id, c.outcome) for c in run.calls] == [("a", "ok"), ("b", "error")]


def test_sleeping_is_virtual_and_every_clock_follows(tmp_path):
    code = ("import time, datetime, asyncio, threading\n"
            "t, m, p, d = time.time(), time.monotonic(), time.perf_counter(), datetime.datetime.now()\n"
            "time.sleep(15)\nasyncio.run(asyncio.sleep(100))\nthreading.Event().wait(1000)\n"
            "import json\nprint(json.dumps([time.time() - t, time.monotonic() - m, time.perf_counter() - p,"
            " (datetime.datetime.now() - d).total_seconds()]))\n")
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "clock.py").write_text(code)
    backend = FakeBackend()
    with backend.private() as endpoint:
        run = LearnerRunner(folder).run("clock.py", endpoint, timeout=30)
    elapsed = json.loads(run.result.stdout)
    assert all(1115 <= e < 1125 for e in elapsed), elapsed
    assert run.result.seconds < 10  # 1115 s of sleeps, graded in real time far shorter


def test_the_runs_clock_is_shared_by_its_processes_and_redis_time_follows_it(tmp_path, backend):
    # a child's sleep moves the parent's clocks (at its next sleep or call), and Redis TIME answers
    # in the run's virtual time, as the harness's records of process calls do
    code = ("import json, os, time, redis, taskproc\n"
            "r = redis.Redis()\nt0 = time.time()\n"
            "if os.fork() == 0:\n    time.sleep(500)\n    os._exit(0)\n"
            "os.wait()\ntime.sleep(0)\ntaskproc.process({'id': 'a', 'kind': 'good'})\n"
            "seconds, micros = r.time()\n"
            "print(json.dumps([time.time() - t0, seconds + micros / 1e6 - t0]))\n")
    clock = RunClock.for_learner_run()
    run, _ = _run(tmp_path, backend, code, run_clock=clock)
    local, server = json.loads(run.result.stdout)
    assert 500 <= local < 510 and 501 <= server < 511, (local, server)
    (call,) = run.calls
    assert call.offset == clock.start + 500   # the child's sleep, before the parent's call


def test_the_runs_clock_is_days_ahead_of_every_real_time_source(tmp_path, backend):
    # TIME inside a Lua script is the server's own clock, which the relay cannot answer for: the run's
    # clock starts days ahead of it, so a first_seen_at taken from it cannot pass for the run's time
    code = ("import datetime, json, time, redis, taskproc\n"
            "r = redis.Redis()\n"
            "local, now = time.time(), datetime.datetime.now().timestamp()\n"
            "seconds, micros = r.time()\n"
            "lua_seconds, lua_micros = r.eval(\"return redis.call('TIME')\", 0)\n"
            "taskproc.process({'id': 'a', 'kind': 'good'})\n"
            "print(json.dumps([local, now, seconds + micros / 1e6, int(lua_seconds) + int(lua_micros) / 1e6]))\n")
    began = time.time()
    run, _ = _run(tmp_path, backend, code)
    local, now, server, lua = json.loads(run.result.stdout)
    (call,) = run.calls
    ahead = RUN_CLOCK_LEAD - 60
    assert local - began > ahead and now - began > ahead and server - began > ahead, (local, now, server, began)
    assert abs(server - local) < 5 and abs(call.t - local) < 5   # one clock: the learner's, TIME's, the record's
    assert abs(lua - began) < 60, (lua, began)   # the server's real time, days behind the run's


def test_a_run_on_real_time_sleeps_for_real_and_gets_its_arguments(tmp_path):
    """RunClock.real(): an exercise whose waits are the broker's own (a min-idle time) or whose output is
    compared with real-time samples; the script's command-line arguments reach it as given."""
    code = ("import json, sys, time\n"
            "t, m = time.time(), time.monotonic()\ntime.sleep(0.3)\n"
            "print(json.dumps([t, time.monotonic() - m, sys.argv[1:]]))\n")
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "clock.py").write_text(code)
    backend = FakeBackend()
    with backend.private() as endpoint:
        before = time.time()
        run = LearnerRunner(folder).run("clock.py", endpoint, timeout=30, run_clock=RunClock.real(),
                                        args=("--count", "7"))
    started, slept, argv = json.loads(run.result.stdout)
    assert abs(started - before) < 5       # the machine's time, not days ahead
    assert 0.3 <= slept < 2
    assert argv == ["--count", "7"]


def test_a_script_that_printed_then_sleeps_past_its_timeout_is_judged_not_rerun(tmp_path):
    """On real time a script may sleep with no broker command; once it has printed it got going, so being
    stopped is a verdict on it, not on a starved machine (no second run, no RunNotStarted)."""
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "producer.py").write_text("import time\nprint('policy=block', flush=True)\ntime.sleep(60)\n")
    with FakeBackend().private() as endpoint:
        run = LearnerRunner(folder).run("producer.py", endpoint, timeout=1.5, run_clock=RunClock.real())
    assert run.result.stopped == "timeout" and run.timing.attempts == 1
    assert "policy=block" in run.result.stdout


def test_a_silent_script_asleep_at_its_timeout_is_judged_not_taken_for_a_starved_one(tmp_path):
    """No output, no broker command, hardly any CPU, but asleep (waiting for a signal) when its time ran
    out: it chose to wait, so the run is judged as it is; a starved script is ready to run instead."""
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "worker.py").write_text("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                      "while True:\n    signal.pause()\n")
    with FakeBackend().private() as endpoint:
        run = LearnerRunner(folder).run("worker.py", endpoint, timeout=1.5, run_clock=RunClock.real())
    assert run.result.stopped == "timeout" and run.timing.attempts == 1 and not run.starved
