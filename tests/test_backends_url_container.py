"""The `url` backend (an existing server the user names) and the `container` backend (testcontainers).

`url` never touches a database that holds keys it did not create: every test runs against a private
redis-server that stands for the user's server, with other people's keys in it, and compares a full
dump of those keys before and after.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis

from retrylab import backends
from retrylab.backends import (CLAIM_KEY, BackendUnavailable, ContainerBackend, Endpoint, RedisServerProcess,
                               UrlBackend, free_port, make_backend)
from retrylab.fixtures.corpus import REFERENCE
from retrylab.grading import grade
from retrylab.runner import LearnerRunner


def retrylab(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrylab", *args], capture_output=True, text=True,
                          timeout=180, env=env)


@pytest.fixture
def server():
    """Stands for the user's server: a private redis-server (never the shared :6379)."""
    with RedisServerProcess() as endpoint:
        yield endpoint


def base_url(server: Endpoint) -> str:
    return f"redis://{server.host}:{server.port}"


def db(server: Endpoint, index: int) -> redis.Redis:
    return Endpoint(server.host, server.port, db=index).client()


def seed_foreign(server: Endpoint, dbs=(0, 1)) -> None:
    for index in dbs:
        client = db(server, index)
        client.set("owner:config", f"db{index}", ex=3600)
        client.rpush("q:tasks", json.dumps({"id": "theirs", "kind": "good"}))   # the same names as the lab's
        client.hset("owner:hash", mapping={"a": "1"})
        client.zadd("owner:zset", {"m": 2})


def full_dump(server: Endpoint) -> dict:
    admin = server.client()
    dump = {}
    for name in admin.info("keyspace"):
        client = db(server, int(name[2:]))
        for key in client.scan_iter(count=1000):
            dump[(name, key)] = (client.type(key), client.dump(key), client.pexpiretime(key))
    return dump


def one_line_no_traceback(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    return done.stderr


# --------------------------------------------------------------------------------------------
# url

def test_reference_passes_on_url_and_foreign_keys_are_untouched(server):
    seed_foreign(server, dbs=(0, 1, 2))
    before = full_dump(server)
    done = retrylab("check", str(REFERENCE), "--backend", "url", "--redis-url",
                    base_url(server), "--format", "exercism")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    results = json.loads(done.stdout)
    assert [t["status"] for t in results["tests"] if "task_id" in t] == ["pass"] * 8
    assert full_dump(server) == before          # db 0-2 exactly as they were; db 3 (used) empty again


def test_named_database_with_foreign_keys_is_refused(server):
    seed_foreign(server, dbs=(5,))
    before = full_dump(server)
    done = retrylab("check", str(REFERENCE), "--backend", "url", "--redis-url", f"redis://{server.host}:{server.port}/5")
    assert "db 5 holds 4 key(s) retrylab did not create" in one_line_no_traceback(done)
    assert full_dump(server) == before


def test_named_database_that_does_not_exist_is_refused(server):
    with pytest.raises(BackendUnavailable, match="db 16 does not exist on this server"):
        UrlBackend(f"{base_url(server)}/16").start()


def test_named_empty_database_is_used(server):
    seed_foreign(server, dbs=(0,))
    before = full_dump(server)
    report = grade(REFERENCE, backend="url", redis_url=f"{base_url(server)}/7", steps=(6, 8))
    assert [r.status for r in report.lab_results] == ["pass", "pass"], [r.message for r in report.lab_results]
    assert full_dump(server) == before


def test_no_empty_database_is_refused_with_the_fix(server):
    for index in range(1, 16):
        db(server, index).set("theirs", "1")
    before = full_dump(server)
    done = retrylab("check", str(REFERENCE), "--step", "3", "--backend", "url",
                    "--redis-url", base_url(server))
    assert "no empty database" in one_line_no_traceback(done)
    assert full_dump(server) == before


def test_two_gradings_on_one_server_claim_different_databases(server):
    seed_foreign(server, dbs=(1,))
    first, second = UrlBackend(base_url(server)), UrlBackend(base_url(server))
    first.start()
    second.start()
    try:
        assert (first.endpoint.db, second.endpoint.db) == (2, 3)
        with first.private() as endpoint:
            endpoint.client().rpush("q:tasks", "mine")
        with second.private() as endpoint:
            endpoint.client().rpush("q:tasks", "yours")
        with first.private() as endpoint:           # emptying its own database leaves the other's alone
            assert endpoint.client().keys("*") == [CLAIM_KEY.encode()]
        assert db(server, 3).lrange("q:tasks", 0, -1) == [b"yours"]
        # a third grading naming a claimed database is told so
        with pytest.raises(BackendUnavailable, match="in use by another retrylab grading"):
            UrlBackend(f"{base_url(server)}/3").start()
    finally:
        first.stop()
        second.stop()
    assert db(server, 2).dbsize() == 0 and db(server, 3).dbsize() == 0   # markers removed, nothing left
    assert db(server, 1).get("owner:config") == b"db1"


def test_a_claim_taken_over_is_never_flushed(server):
    backend = UrlBackend(base_url(server))
    backend.start()
    try:
        with backend.private() as endpoint:
            client = endpoint.client()
            client.set(CLAIM_KEY, "another-grading")
            client.rpush("q:tasks", "theirs now")
        with pytest.raises(BackendUnavailable, match="claimed by another grading"):
            with backend.private():
                pass
    finally:
        backend.stop()
    assert db(server, 1).lrange("q:tasks", 0, -1) == [b"theirs now"]   # stop() left it too


def test_a_marker_deleted_by_a_learner_script_is_taken_again(server):
    backend = UrlBackend(base_url(server))
    backend.start()
    try:
        with backend.private() as endpoint:
            endpoint.client().flushdb()               # what a learner's script might do
            endpoint.client().rpush("q:tasks", "left over")
        with backend.private() as endpoint:
            assert endpoint.client().keys("*") == [CLAIM_KEY.encode()]
    finally:
        backend.stop()
    assert db(server, 1).dbsize() == 0


def test_learner_connections_land_in_the_claimed_database(server, tmp_path):
    seed_foreign(server, dbs=(0, 1))
    before = full_dump(server)
    (tmp_path / "script.py").write_text(
        "import os, redis\n"
        "redis.Redis().rpush('seen', 'default')\n"
        "redis.Redis.from_url(os.environ['REDIS_URL']).rpush('seen', 'from-url')\n"
        "redis.StrictRedis(host='localhost', port=6379, db=0).rpush('seen', 'db-0-asked')\n")
    backend = UrlBackend(base_url(server))
    backend.start()
    try:
        with backend.private() as endpoint:
            run = LearnerRunner(tmp_path).run("script.py", endpoint, timeout=30)
            assert run.result.returncode == 0, run.result.stderr
            assert endpoint.db == 2
            assert db(server, 2).lrange("seen", 0, -1) == [b"default", b"from-url", b"db-0-asked"]
    finally:
        backend.stop()
    assert full_dump(server) == before


def test_a_server_with_a_password(server):
    server.client().config_set("requirepass", "s3cret")
    try:
        report = grade(REFERENCE, backend="url", redis_url=f"redis://:s3cret@{server.host}:{server.port}",
                       steps=(1, 2, 8))
        assert [r.status for r in report.lab_results] == ["pass"] * 3, [r.message for r in report.lab_results]
        done = retrylab("check", str(REFERENCE), "--backend", "url", "--redis-url",
                        f"redis://:wrong@{server.host}:{server.port}")
        stderr = one_line_no_traceback(done)
        assert "cannot use Redis" in stderr and "wrong" not in stderr
    finally:
        Endpoint(server.host, server.port, password="s3cret").client().config_set("requirepass", "")


@pytest.mark.parametrize("args, reason", [
    (["--backend", "url"], "add --redis-url"),
    (["--redis-url", "redis://127.0.0.1:1"], "--redis-url names a server for --backend url"),
    (["--backend", "url", "--redis-url", "rediss://127.0.0.1:1"], "only redis://host:port[/db]"),
    (["--backend", "url", "--redis-url", "redis://127.0.0.1:1/x"], "is not a number"),
    (["--backend", "url", "--redis-url", "redis://127.0.0.1:PORT"], "cannot use Redis at"),
])
def test_url_usage_errors_exit_2_with_one_line(args, reason):
    args = [a.replace("PORT", str(free_port())) for a in args]
    done = retrylab("check", str(REFERENCE), *args)
    assert reason in one_line_no_traceback(done)


# --------------------------------------------------------------------------------------------
# container

def docker_engine_answers() -> bool:
    try:
        backends._docker_engine().close()
        return True
    except BackendUnavailable:
        return False


def test_container_backend_without_a_docker_engine_exits_2_at_once(tmp_path):
    # whatever this machine has, point docker at an engine that is not there
    env = {"PATH": "/usr/bin:/bin", "DOCKER_HOST": f"unix://{tmp_path}/docker.sock", "HOME": str(tmp_path)}
    done = retrylab("check", str(REFERENCE), "--backend", "container", env=env)
    assert "no Docker engine answers" in one_line_no_traceback(done)
    assert done.stdout == ""


@pytest.mark.skipif(not docker_engine_answers(), reason="no Docker engine")
def test_reference_passes_on_a_redis_container():
    done = retrylab("check", str(REFERENCE), "--backend", "container", "--format", "exercism")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert [t["status"] for t in json.loads(done.stdout)["tests"] if "task_id" in t] == ["pass"] * 8


class _StandInContainer:
    """testcontainers' RedisContainer's surface, backed by a private redis-server: exercises the
    container backend's own code (ports, emptying per check, stopping) where Docker is missing."""
    started: list = []

    def __init__(self, image):
        self.image = image
        self._server = RedisServerProcess()

    def start(self):
        self.endpoint = self._server.start()
        self.started.append(self)
        return self

    def get_container_host_ip(self):
        return "localhost"

    def get_exposed_port(self, port):
        assert port == 6379
        return str(self.endpoint.port)

    def stop(self):
        self._server.stop()
        self.stopped = True


def test_container_backend_code_with_a_stand_in_container(monkeypatch):
    monkeypatch.setattr(backends, "_redis_container_class", lambda: _StandInContainer)
    monkeypatch.setattr(backends, "_docker_engine", lambda: type("Engine", (), {"close": lambda self: None})())
    report = grade(REFERENCE, backend="container")
    assert [r.status for r in report.lab_results] == ["pass"] * 8, [r.message for r in report.lab_results]
    container = _StandInContainer.started[-1]
    assert container.image == ContainerBackend().image and container.stopped


def test_make_backend_lists_every_backend():
    with pytest.raises(BackendUnavailable, match="fake, redis-server, url, container"):
        make_backend("nats")
    assert isinstance(make_backend("url", redis_url="redis://h:1"), UrlBackend)
