"""A Ctrl-C that lands while a private server is being started, or while the fake server process is being
asked for a server, leaves nothing waiting for ever: no thread, no exit, no later request (`retrylab watch`
hung after Ctrl-C in CI: a `ready` line read by the interrupted thread was waited for again by another)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from retrylab import spawn
from retrylab.brokers.redis.fake_server_process import FakeServerProcess

from helpers import alive, wait_until


def test_the_spawning_thread_never_holds_the_interpreter_at_exit():
    # the spawner starts inside a child interpreter, which then exits without stopping anything
    code = textwrap.dedent("""
        import subprocess, sys
        from retrylab.spawn import spawn_server
        proc = spawn_server([sys.executable, "-c", "pass"])
        proc.wait()
        print("done", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "done\n" and done.returncode == 0, done.stderr


def test_a_server_whose_caller_stopped_waiting_is_killed_once_it_exists(monkeypatch):
    made: list[subprocess.Popen] = []
    started = threading.Event()
    release = threading.Event()
    real_popen = subprocess.Popen

    def slow_popen(*args, **kwargs):   # the fork takes long (a loaded machine); the caller is interrupted meanwhile
        started.set()
        release.wait(10)
        proc = real_popen(*args, **kwargs)
        made.append(proc)
        return proc

    monkeypatch.setattr(spawn.subprocess, "Popen", slow_popen)
    real_result = spawn.concurrent.futures.Future.result

    def interrupted_result(self, timeout=None):
        started.wait(10)
        raise KeyboardInterrupt

    monkeypatch.setattr(spawn.concurrent.futures.Future, "result", interrupted_result)
    with pytest.raises(KeyboardInterrupt):
        spawn.spawn_server([sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setattr(spawn.concurrent.futures.Future, "result", real_result)
    release.set()
    wait_until(lambda: made, "the server to be started", timeout=20)
    wait_until(lambda: not alive(made[0].pid), "the server nobody waits for any more to end", timeout=20)


@pytest.mark.parametrize("cut_at", ["ready", "port"])
def test_an_exchange_cut_short_ends_that_child_and_the_next_request_gets_a_server(cut_at):
    servers = FakeServerProcess().start()
    first = servers.pid
    real_line = servers._line
    reads = []

    def line_then_interrupt(timeout):
        text = real_line(timeout)          # the answer is read, then the Ctrl-C lands
        reads.append(text)
        if (text == "ready") == (cut_at == "ready"):
            raise KeyboardInterrupt
        return text

    servers._line = line_then_interrupt
    try:
        with pytest.raises(KeyboardInterrupt):
            servers.new_server()
        assert reads[-1] == "ready" if cut_at == "ready" else reads[-1].isdigit()
        assert not alive(first), "the child whose answer was lost is still running"
        del servers._line
        answer: list[int] = []
        asking = threading.Thread(target=lambda: answer.append(servers.new_server()), daemon=True)
        asking.start()
        asking.join(60)
        assert answer and answer[0] > 0, "a later request waited for an answer that had been read already"
        assert servers.pid != first
    finally:
        servers.stop()


def test_a_child_that_never_answers_gives_a_backend_error_not_a_wait(monkeypatch):
    from retrylab.brokers.redis import fake_server_process
    from retrylab.brokers import BackendUnavailable
    monkeypatch.setattr(fake_server_process, "READY_TIMEOUT", 0.5)
    servers = FakeServerProcess()
    servers._proc = spawn.spawn_server([sys.executable, "-c", "import time; time.sleep(60)"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    silent = servers._proc
    began = time.monotonic()
    with pytest.raises(BackendUnavailable, match="did not answer"):
        servers.new_server()
    assert time.monotonic() - began < 10
    silent.wait(10)
    assert not alive(silent.pid)
