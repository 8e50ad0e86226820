"""The `url` backend (an existing server the user names) and the `container` backend (a Docker engine).

`url` never touches a database that holds keys it did not create: every test runs against a private
redis-server that stands for the user's server, with other people's keys in it, and compares a full
dump of those keys before and after.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from retrylab.brokers import BackendUnavailable
from retrylab.brokers.redis import container as container_backend
from retrylab.brokers.redis import container_image, containers
from retrylab.brokers.redis.backends import make_backend
from retrylab.brokers.redis.container import ContainerBackend
from retrylab.brokers.redis.endpoint import Endpoint, free_port
from retrylab.brokers.redis.server_process import RedisServerProcess
from retrylab.brokers.redis.url import CLAIM_KEY, UrlBackend
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE
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
# container: on a real Docker engine when one answers (start dockerd; the image is made from this
# machine's redis-server, no registry needed), else skipped with the reason

def _engine_or_reason():
    try:
        return containers.docker_engine(), None
    except BackendUnavailable as exc:
        return None, str(exc)


@pytest.fixture(scope="session")
def engine():
    engine, reason = _engine_or_reason()
    if engine is None:
        pytest.skip(f"container backend on a real engine: {reason}")
    try:
        container_image.ensure_image(engine)     # retrylab/redis:latest, the backend's default
    except container_image.ImageUnavailable as exc:
        pytest.skip(f"cannot make the Redis image here: {exc}")
    yield engine
    engine.close()


def owned_by(engine, pid: int) -> list[dict]:
    """The containers labelled as `pid`'s (the plain listing: it does not fail on one being removed)."""
    return engine.api.containers(all=True, filters={"label": f"{containers.LABEL_PID}={pid}"})


def check_in_background(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "retrylab", "check", str(REFERENCE), "--backend", "container",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_container_backend_without_a_docker_engine_exits_2_at_once(tmp_path):
    # whatever this machine has, point docker at an engine that is not there
    env = {"PATH": "/usr/bin:/bin", "DOCKER_HOST": f"unix://{tmp_path}/docker.sock", "HOME": str(tmp_path)}
    done = retrylab("check", str(REFERENCE), "--backend", "container", env=env)
    assert "no Docker engine answers" in one_line_no_traceback(done)
    assert done.stdout == ""


def test_reference_passes_on_a_redis_container_and_leaves_none(engine):
    proc = check_in_background("--format", "exercism")
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stdout[-3000:] + stderr
    assert [t["status"] for t in json.loads(stdout)["tests"] if "task_id" in t] == ["pass"] * 8
    assert owned_by(engine, proc.pid) == []


def test_each_private_redis_is_an_empty_container_of_its_own(engine):
    backend = ContainerBackend()
    backend.start()
    try:
        with backend.private() as first, first.client() as a:
            a.rpush("q:tasks", "left over")
            sha = a.script_load("return 1")
            a.function_load("#!lua name=left\nredis.register_function('left', function() return 1 end)")
            with backend.private() as second, second.client() as b:    # in use at once: another container
                assert second.port != first.port and b.dbsize() == 0
                assert a.info("server")["run_id"] != b.info("server")["run_id"]
            ours = owned_by(engine, os.getpid())
            assert len(ours) == 2 and all(c["Labels"][containers.LABEL_MACHINE] for c in ours)
            published = [p for c in ours for p in c["Ports"] if p.get("PrivatePort") == 6379]
            assert {p["PublicPort"] for p in published} == {first.port, second.port}
            assert {p["IP"] for p in published} == {"127.0.0.1"}
        with backend.private() as again, again.client() as c:
            assert c.dbsize() == 0 and c.script_exists(sha) == [False] and c.function_list() == []
            with contextlib.suppress(redis.ConnectionError):
                c.shutdown(nosave=True)                   # what a learner's script may send
        with backend.private() as replaced, replaced.client() as d:    # a new container, not an error
            assert d.ping() and d.dbsize() == 0
        assert len(owned_by(engine, os.getpid())) == 2
    finally:
        backend.stop()
    assert owned_by(engine, os.getpid()) == []


def test_a_missing_local_image_is_one_line_with_the_fix(engine):
    env = {**os.environ, "RETRYLAB_REDIS_IMAGE": "retrylab/redis:0.0.0-absent"}
    stderr = one_line_no_traceback(retrylab("check", str(REFERENCE), "--backend", "container", env=env))
    assert "no image retrylab/redis:0.0.0-absent" in stderr and "python -m retrylab.brokers.redis.container_image" in stderr


def test_an_image_that_cannot_be_pulled_gives_the_whole_reason(engine):
    # a registry on a closed local port: the engine answers, the pull fails (no traffic leaves the machine)
    image = f"127.0.0.1:{free_port()}/retrylab-absent:1"
    env = {**os.environ, "RETRYLAB_REDIS_IMAGE": image}
    stderr = one_line_no_traceback(retrylab("check", str(REFERENCE), "--backend", "container", env=env))
    assert f"cannot pull image {image}:" in stderr and "connection refused" in stderr
    assert stderr.rstrip().endswith("unset RETRYLAB_REDIS_IMAGE")     # whole, not cut


@pytest.fixture
def exiting_image(engine):
    """An image whose redis-server is /bin/false: the container starts and exits at once."""
    false = Path(shutil.which("false")).resolve()
    engine.api.import_image_from_data(
        container_image.root_filesystem(false, container_image.shared_libraries(false)),
        repository="retrylab-test/exits", tag="1", changes=[f"ENV PATH={Path(container_image.BINARY_IN_IMAGE).parent}"])
    yield "retrylab-test/exits:1"
    engine.images.remove("retrylab-test/exits:1", force=True)


def test_a_container_that_exits_at_once_is_one_line_before_grading(engine, exiting_image):
    proc = check_in_background(env={**os.environ, "RETRYLAB_REDIS_IMAGE": exiting_image})
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2 and stdout == "", stdout
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert f"the Redis container from {exiting_image} stopped (exit code 1) before it answered" in stderr
    assert owned_by(engine, proc.pid) == []


def test_sigterm_removes_the_gradings_containers(engine):
    proc = check_in_background()
    try:
        deadline = time.monotonic() + 60
        while len(owned_by(engine, proc.pid)) < 2:    # the probe starts one; the grading runs two at once
            assert proc.poll() is None and time.monotonic() < deadline, "the grading never ran two containers"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    # `retrylab check` turns SIGTERM into an interrupted grading (exit 130); the backend's own handler
    # (SIGTERM kept as the cause of death) serves where nothing else handles it
    assert proc.returncode == 130 and "interrupted" in stderr, stdout[-3000:] + stderr[-3000:]
    assert owned_by(engine, proc.pid) == []


def test_containers_of_a_grading_that_is_gone_are_removed_at_start(engine):
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale_labels = {**containers.owner_labels(), containers.LABEL_PID: str(gone.pid), containers.LABEL_STARTED: "1"}
    stale = engine.containers.create(container_image.DEFAULT_IMAGE, labels=stale_labels)
    alive = engine.containers.create(container_image.DEFAULT_IMAGE, labels=containers.owner_labels())   # this process: still grading
    elsewhere = engine.containers.create(container_image.DEFAULT_IMAGE, labels={
        **stale_labels, containers.LABEL_MACHINE: "another-machine/boot"})   # pids there mean nothing here
    try:
        backend = ContainerBackend()
        backend.start()
        backend.stop()
        left = {c["Id"] for c in engine.api.containers(all=True)}
        assert stale.id not in left and alive.id in left and elsewhere.id in left
    finally:
        for container in (stale, alive, elsewhere):
            with contextlib.suppress(Exception):
                container.remove(force=True)


def test_making_the_image_again_keeps_it(engine):
    before = engine.images.get(container_image.DEFAULT_IMAGE).id
    tag = container_image.ensure_image(engine)
    assert tag == f"{container_image.REPOSITORY}:{container_image.redis_version(container_image.host_redis_server())}"
    assert engine.images.get(tag).id == engine.images.get(container_image.DEFAULT_IMAGE).id == before


def test_container_backend_pool_with_stand_in_containers(monkeypatch):
    """The backend's own bookkeeping where no engine runs: each container stands in as a private
    redis-server; every one started is removed at the end, and privates in use at once differ."""
    started, removed = {}, []

    def start(image):
        server = RedisServerProcess()
        started[f"c{len(started)}"] = server
        return f"c{len(started) - 1}", server.start()

    def remove(ids):
        for container_id in ids:
            started[container_id].stop()
            removed.append(container_id)

    monkeypatch.setattr(container_backend, "_docker_engine", lambda: type("Engine", (), {"close": lambda self: None})())
    monkeypatch.setattr(containers, "sweep_stale", lambda engine: 0)
    monkeypatch.setattr(containers, "ensure_image_present", lambda engine, image: None)
    monkeypatch.setattr(containers, "start_redis_container", start)
    monkeypatch.setattr(containers, "remove_containers", remove)
    report = grade(REFERENCE, backend="container")
    assert [r.status for r in report.lab_results] == ["pass"] * 8, [r.message for r in report.lab_results]
    assert len(started) >= 2 and sorted(removed) == sorted(started)   # the worker runs went on alongside


def test_make_backend_lists_every_backend():
    with pytest.raises(BackendUnavailable, match="fake, redis-server, url, container"):
        make_backend("nats")
    assert isinstance(make_backend("url", redis_url="redis://h:1"), UrlBackend)


def test_a_create_request_cut_after_the_engine_made_the_container_leaves_none(engine, monkeypatch):
    """Ctrl-C (or SIGTERM, which `check` turns into it) in the middle of the create request: the engine
    has made the container, its id never arrives. It must not stay behind, "Created" (seen in CI)."""
    import docker.models.containers
    real_create = docker.models.containers.ContainerCollection.create

    def create_then_interrupted(self, *args, **kwargs):
        real_create(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(docker.models.containers.ContainerCollection, "create", create_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        containers.start_redis_container(container_image.DEFAULT_IMAGE)
    assert owned_by(engine, os.getpid()) == []
