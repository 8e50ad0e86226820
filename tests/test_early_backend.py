"""A backend started ahead of the grading (retrylab.brokers.start_early: `retrylab check` starts it while
pytest is imported) is the one the grading takes, is never started twice, says why it cannot start where
the grading asks for it, and is stopped when no grading takes it."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from helpers import alive, wait_until
from retrylab import brokers, cli
from retrylab.brokers import BackendUnavailable
from retrylab.brokers.redis.fake import FakeBackend
from retrylab.fixtures.backoff_dlq import corpus


@pytest.fixture(autouse=True)
def nothing_left_early():
    yield
    brokers.stop_unused()


@pytest.fixture
def starts(monkeypatch) -> list[tuple[FakeBackend, int]]:
    """Every fake backend started, with its server process's pid, in order."""
    started: list[tuple[FakeBackend, int]] = []
    real_start = FakeBackend.start

    def start(self):
        real_start(self)
        started.append((self, self._servers.pid))
    monkeypatch.setattr(FakeBackend, "start", start)
    return started


def stopped(pid: int) -> bool:
    return wait_until(lambda: not alive(pid), f"the fake server process {pid} to end") or True


def test_the_grading_takes_the_backend_started_early_and_it_serves(starts):
    brokers.start_early("redis", "fake", redis_url=None)
    backend = brokers.started_backend("redis", "fake")      # an option left at None is the same setting
    try:
        assert [b for b, _ in starts] == [backend]
        with backend.private() as endpoint, endpoint.client() as client:
            assert client.ping()
    finally:
        backend.stop()


def test_other_settings_start_their_own_and_the_unused_one_is_stopped(starts):
    brokers.start_early("redis", "fake")
    with pytest.raises(BackendUnavailable, match="--redis-url"):
        brokers.started_backend("redis", "fake", redis_url="redis://127.0.0.1:1/0")
    brokers.stop_unused()
    assert len(starts) == 1 and stopped(starts[0][1])


def test_a_backend_that_cannot_start_early_says_so_where_the_grading_takes_it(monkeypatch):
    def cannot_start(self):
        raise BackendUnavailable("no fake Redis today")
    monkeypatch.setattr(FakeBackend, "start", cannot_start)
    brokers.start_early("redis", "fake")
    with pytest.raises(BackendUnavailable, match="no fake Redis today"):
        brokers.started_backend("redis", "fake")


def test_check_starts_one_backend_and_leaves_none_behind(starts, capsys):
    assert cli.main(["check", str(corpus.REFERENCE), "--step", "1", "--format", "exercism"]) == 0
    assert len(starts) == 1, "the grading started a second backend beside the early one"
    assert stopped(starts[0][1])


def test_check_stopped_before_grading_stops_the_early_backend(starts, monkeypatch, capsys):
    from retrylab.commands import check
    monkeypatch.setattr(check, "require_isolation", lambda isolation, exercise: (_ for _ in ()).throw(
        check.UsageError("--isolation required: not here")))
    assert cli.main(["check", str(corpus.REFERENCE)]) == 2
    assert "not here" in capsys.readouterr().err
    assert len(starts) == 1 and stopped(starts[0][1])


def test_every_brokers_endpoint_module_is_whole_before_any_beside_thread_needs_it():
    # Two threads importing one module for the first time, and a Ctrl-C then, can leave its import lock held for
    # good in Python 3.11 (retrylab.background): what the early runs' threads call first (a private server's
    # endpoint, its link) is imported by the thread that starts the backend or with the endpoint module itself.
    probe = ("import sys\n"
             "from retrylab.brokers.redis.fake import FakeBackend\n"
             "import retrylab.brokers.nats.endpoint, retrylab.brokers.kafka.endpoint\n"
             "backend = FakeBackend(); backend.start()\n"
             "try:\n"
             "    print(sorted(m for m in ('retrylab.brokers.redis.endpoint', 'retrylab.brokers.nats.link',\n"
             "                             'retrylab.brokers.nats.admin', 'retrylab.brokers.kafka.link',\n"
             "                             'confluent_kafka.admin') if m not in sys.modules))\n"
             "finally:\n"
             "    backend.stop()\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_ctrl_c_while_the_grading_waits_for_its_backend_leaves_it_for_stop_unused_to_stop(monkeypatch):
    # the grading took the early backend off the list, then a Ctrl-C landed while it waited for the start:
    # nobody stopped the backend once started (its servers outlived the grading)
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    release, stopped = threading.Event(), []
    monkeypatch.setattr(FakeBackend, "start", lambda self: release.wait(10))
    monkeypatch.setattr(FakeBackend, "stop", lambda self: stopped.append(self))
    brokers.start_early("redis", "fake", redis_url=None)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()
            brokers.started_backend("redis", "fake", redis_url=None)
    finally:
        signal.signal(signal.SIGINT, previous)
    release.set()
    brokers.stop_unused()
    assert len(stopped) == 1
