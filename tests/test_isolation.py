"""Learner processes in namespaces of their own (retrylab.sandbox, supervisor.py): what a script sees
and reaches, under bubblewrap and under unshare(2) alike, and the hostile submissions that try to get
out (fixtures/submissions/hostile: proxy-bypass, shared-service-probe, persistence, neighbour),
graded on both backends with a check that nothing escaped: no key on a probe server, nothing left in
the host's /run/lock, /dev/shm or SysV IPC, the neighbour of a batch untouched."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import scripts_folder
from retrylab import sandbox
from retrylab.brokers.redis.link import REDIRECT
from retrylab.brokers.redis.server_process import RedisServerProcess
from retrylab.fixtures.backoff_dlq import corpus
from retrylab.grading import grade
from retrylab.brokers.redis.proxy import RecordingProxy
from retrylab.containment import NAMESPACES_VARIABLE, Containment
from retrylab.sandbox import Sandbox

DETECTED = sandbox.containment()
KINDS = ["unshare"] + (["bwrap"] if shutil.which("bwrap") else [])
ENTRIES = {e.name: e for e in corpus.entries("hostile")}
BACKENDS = ["fake", "redis-server"]
PERSISTENCE_NAME = "retrylab-hostile-persistence"
PERSISTENCE_KEY = 0x52544C50   # the fixture's SysV IPC key
SCRATCH = ("/run/lock", "/dev/shm", "/tmp", "/var/tmp")

needs_isolation = pytest.mark.skipif(not DETECTED.isolated, reason="no namespaces here: isolation is partial")


def _containment(kind: str) -> Containment:
    return dataclasses.replace(DETECTED, namespaces=kind, bwrap=(shutil.which("bwrap") or "") if kind == "bwrap" else "")


# --------------------------------------------------------------------------------------------------
# What a script sees, run by run (both implementations)

LOOK_AROUND = """
    import json, os, socket
    seen = {"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "hostname": socket.gethostname(),
            "root": sorted(os.listdir("/")),
            "readable": {p: os.path.exists(p) for p in json.loads(os.environ["PROBE_PATHS"])},
            "cmdlines": [open(f"/proc/{p}/cmdline", "rb").read().decode("utf-8", "replace")
                         for p in os.listdir("/proc") if p.isdigit()]}
    writable = {}
    for folder in ("/tmp", "/var/tmp", "/run/lock", "/dev/shm", "/usr", "/etc", "/"):
        try:
            with open(os.path.join(folder, os.environ["PROBE_NAME"]), "w") as f:
                f.write("x")
            writable[folder] = True
        except OSError:
            writable[folder] = False
    seen["writable"] = writable
    try:
        socket.create_connection(("127.0.0.1", int(os.environ["HOST_PORT"])), timeout=2).close()
        seen["host_port"] = "connected"
    except OSError as exc:
        seen["host_port"] = exc.strerror
    print(json.dumps(seen))
"""


@pytest.mark.parametrize("kind", KINDS)
def test_a_script_sees_only_its_own_processes_files_and_no_network(kind, tmp_path):
    other_run = Path(f"/tmp/retrylab-run-neighbour-{uuid.uuid4().hex}")
    probe_name = f"retrylab-probe-{uuid.uuid4().hex}"
    other_run.mkdir(mode=0o755)
    (other_run / "worker.py").write_text("secret = 1\n")
    repository = Path(sandbox.__file__).resolve().parent.parent
    probes = [str(repository / "README.md"), str(repository / "harness" / "sandbox.py"),
              str(repository / "tests"), str(other_run / "worker.py"), str(Path(sys.base_prefix) / "lib")]
    with socket.socket() as listener:   # a service on the host's loopback
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        folder = scripts_folder(tmp_path, look=LOOK_AROUND)
        try:
            with Sandbox(folder, containment=_containment(kind)) as box:
                result = box.run("look.py", env={"PROBE_PATHS": json.dumps(probes), "PROBE_NAME": probe_name,
                                                 "HOST_PORT": str(listener.getsockname()[1])}, timeout=30)
                root = box.root
        finally:
            shutil.rmtree(other_run)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert len(seen["pids"]) <= 3 and max(seen["pids"]) < 10, seen["pids"]  # its own PID namespace
    assert not any("pytest" in c for c in seen["cmdlines"]), seen["cmdlines"]
    assert seen["hostname"] == "retrylab"
    assert seen["readable"] == {probes[0]: False, probes[1]: False, probes[2]: False, probes[3]: False,
                                probes[4]: True}, seen["readable"]
    assert seen["writable"] == {"/tmp": True, "/var/tmp": True, "/run/lock": True, "/dev/shm": True,
                                "/usr": False, "/etc": False, "/": False}, seen["writable"]
    assert seen["host_port"] != "connected"
    for folder in ("/tmp", "/var/tmp", "/run/lock", "/dev/shm"):  # private: nothing reached the host
        assert not os.path.exists(os.path.join(folder, probe_name)), folder
    assert not root.exists()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("client", ["sync", "asyncio"])
def test_the_broker_is_reached_through_the_unix_socket_whatever_the_script_names(kind, client, tmp_path,
                                                                                 private_redis_server):
    endpoint = private_redis_server
    key = f"isolation-{uuid.uuid4().hex}"
    if client == "sync":
        code = f"""
            import redis
            for client in (redis.Redis(), redis.Redis(host="10.1.2.3", port=1234, db=7),
                           redis.Redis.from_url("rediss://user:pw@example.com:6380/3"),
                           redis.Redis(unix_socket_path="/nowhere.sock")):
                client.rpush("{key}", "x")
            print(redis.Redis.from_url(__import__("os").environ["REDIS_URL"]).llen("{key}"))
        """
    else:
        code = f"""
            import asyncio
            import redis.asyncio as aredis
            async def main():
                for client in (aredis.Redis(), aredis.Redis(host="10.1.2.3", port=1234),
                               aredis.Redis.from_url("redis://localhost:6379/5")):
                    await client.rpush("{key}", "x")
                    await client.aclose()
                return await aredis.Redis().llen("{key}")
            print(asyncio.run(main()))
        """
    folder = scripts_folder(tmp_path, talk=code)
    with RecordingProxy((endpoint.host, endpoint.port)) as proxy, \
            Sandbox(folder, containment=_containment(kind)) as box:
        path = box.socket_path("redis.sock")
        proxy.serve_unix(path)
        assert path.parent.stat().st_uid == os.geteuid() and path.parent.stat().st_mode & 0o777 == 0o755
        env = {"RETRYLAB_BROKER_REDIRECT": str(REDIRECT), "RETRYLAB_REDIS_HOST": "127.0.0.1", "RETRYLAB_REDIS_PORT": str(proxy.address[1]),
               "RETRYLAB_REDIS_SOCKET": str(path), "REDIS_URL": f"unix://{path}?db=0"}
        result = box.run("talk.py", env=env, timeout=30)
        commands = [c.name for c in proxy.commands()]
    assert result.returncode == 0, result.stderr
    expected = 4 if client == "sync" else 3
    assert result.stdout.split()[-1] == str(expected)
    assert commands.count("RPUSH") == expected  # every one through the relay
    with endpoint.client() as direct:
        assert direct.llen(key) == expected


@pytest.mark.parametrize("kind", KINDS)
def test_a_fork_bomb_in_a_namespace_is_still_bounded_and_named(kind, tmp_path):
    folder = scripts_folder(tmp_path, bomb="import os\nwhile True:\n    os.fork()\n")
    with Sandbox(folder, sandbox.Limits(processes=12), containment=_containment(kind)) as box:
        result = box.run("bomb.py", env={}, timeout=30)
    assert "the limit of 12 processes" in result.describe(), result.describe()


@pytest.mark.parametrize("kind", KINDS)
def test_exit_status_and_death_by_signal_are_the_scripts(kind, tmp_path):
    folder = scripts_folder(tmp_path, seven="raise SystemExit(7)\n",
                         segv="import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    with Sandbox(folder, containment=_containment(kind)) as box:
        assert box.run("seven.py", env={}, timeout=30).returncode == 7
        assert box.run("segv.py", env={}, timeout=30).returncode == -11


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_that_never_exits_is_stopped_as_soon_as_asked(kind, tmp_path):
    # the supervisor must be watching (not still waiting on a helper) when the harness says stop
    folder = scripts_folder(tmp_path, forever="import time\nwhile True:\n    time.sleep(0.01)\n")
    with Sandbox(folder, containment=_containment(kind)) as box:
        asked = []
        result = box.run("forever.py", env={}, timeout=60,
                         stop_when=lambda: bool(asked) or asked.append(time.monotonic()) and False)
        stopped_after = time.monotonic() - asked[0]
    assert result.stopped == "settled"
    assert stopped_after < sandbox.STOP_GRACE + 3, stopped_after


@pytest.mark.skipif(not DETECTED.unprivileged_uid, reason="needs root: a uid per run")
def test_without_namespaces_what_a_run_leaves_in_ipc_and_run_lock_goes_with_it(tmp_path):
    name = f"retrylab-left-{uuid.uuid4().hex}"
    folder = scripts_folder(tmp_path, leave=f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        made = [libc.msgget(0, 0o1666), libc.shmget(0, ctypes.c_size_t(4096), 0o1666), libc.semget(0, 1, 0o1666)]
        with open("/run/lock/{name}", "w") as f:
            f.write("x")
        print(made)
    """)
    plain = dataclasses.replace(DETECTED, namespaces="", bwrap="")
    with Sandbox(folder, containment=plain) as box:
        result = box.run("leave.py", env={}, timeout=30)
        uid = box.uid
        assert result.returncode == 0, result.stderr
        assert all(i >= 0 for i in json.loads(result.stdout)), result.stdout
        assert _ipc_of(uid) and os.path.exists(f"/run/lock/{name}")
    assert _ipc_of(uid) == [] and not os.path.exists(f"/run/lock/{name}")


def _ipc_of(uid: int) -> list[str]:
    found = []
    for table in ("msg", "shm", "sem"):
        with open(f"/proc/sysvipc/{table}") as f:
            header, *rows = [line.split() for line in f if line.strip()]
        found += [f"{table} {row[1]}" for row in rows if row[header.index("uid")] == str(uid)]
    return found


def test_isolation_required_refuses_to_grade_without_namespaces(tmp_path):
    env = {**os.environ, NAMESPACES_VARIABLE: "none"}
    batch = tmp_path / "submissions"
    corpus.load(corpus.SUBMISSIONS / "correct" / "noisy-worker").materialize(batch / "one")   # grade-batch refuses an empty folder
    for command in (["check", str(corpus.REFERENCE)], ["grade-batch", str(batch), "--out", str(tmp_path / "g.csv")]):
        done = subprocess.run([sys.executable, "-m", "retrylab", *command, "--isolation", "required"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "--isolation required" in done.stderr, done.stderr
        assert done.stdout == ""
    from retrylab import exercise
    plain_pytest = subprocess.run([sys.executable, "-m", "pytest", str(exercise.get("backoff-dlq").folder),
                                   "--solution", str(corpus.REFERENCE), "--isolation", "required", "-p", "no:randomly",
                                   "-p", "no:cacheprovider", "-q", "--step", "3"],
                                  capture_output=True, text=True, env=env, timeout=120)
    assert plain_pytest.returncode == 2, plain_pytest.stdout[-2000:]
    assert "--isolation required" in plain_pytest.stdout + plain_pytest.stderr
    assert " passed" not in plain_pytest.stdout


def test_partial_isolation_is_said_in_the_report():
    env = {**os.environ, NAMESPACES_VARIABLE: "none"}
    done = subprocess.run([sys.executable, "-m", "retrylab", "check", str(corpus.REFERENCE), "--step", "3"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "isolation is partial" in done.stdout
    if DETECTED.isolated:
        done = subprocess.run([sys.executable, "-m", "retrylab", "check", str(corpus.REFERENCE), "--step", "3",
                               "--isolation", "required"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "isolation is partial" not in done.stdout, done.stdout + done.stderr


# --------------------------------------------------------------------------------------------------
# Hostile submissions that try to get out, graded

def _host_leftovers() -> list[str]:
    """What the persistence fixture leaves where the host would see it."""
    left = [f"{folder}/{PERSISTENCE_NAME}" for folder in SCRATCH if os.path.lexists(f"{folder}/{PERSISTENCE_NAME}")]
    for table in ("msg", "shm", "sem"):
        with open(f"/proc/sysvipc/{table}") as f:
            keys = [int(line.split()[0]) for line in f.readlines()[1:] if line.split()]
        left += [f"SysV {table} key {PERSISTENCE_KEY:#x}" for key in keys if key == PERSISTENCE_KEY]
    return left


def _grade_entry(name: str, backend: str, tmp_path: Path, **files: str):
    entry = ENTRIES[name]
    submission = entry.materialize(tmp_path / name)
    for filename, text in files.items():
        (submission / filename).write_text(text)
    report = grade(submission, backend=backend)
    explain = "\n".join(f"{r.name} {r.status}: {r.message[:400]}" for r in report.results)
    assert {r.number: r.status for r in report.lab_results} == entry.expect, f"{entry.why}\n{explain}"
    assert not report.harness_error, report.harness_error
    return report, "\n".join(r.output for r in report.results)


@needs_isolation
@pytest.mark.parametrize("backend", BACKENDS)
def test_proxy_bypass_finds_no_way_around_the_relay(backend, tmp_path):
    _, output = _grade_entry("proxy-bypass", backend, tmp_path)
    assert "around the relay" not in output.replace("no way around the relay", ""), output[-2000:]
    assert "bypass: no way around the relay" in output


@needs_isolation
@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_service_probe_reaches_nothing(backend, tmp_path):
    with RedisServerProcess() as probe:   # the test's own server on a free port, never the machine's
        _, output = _grade_entry("shared-service-probe", backend, tmp_path, **{"probe_port.txt": str(probe.port)})
        with probe.client() as client:
            assert client.dbsize() == 0, client.keys("*")
    assert "probe: nothing reached" in output and "probe: reached" not in output, output[-2000:]


@needs_isolation
@pytest.mark.parametrize("backend", BACKENDS)
def test_persistence_leaves_nothing_for_the_next_run(backend, tmp_path):
    assert _host_leftovers() == [], "left by something before this test"
    _, output = _grade_entry("persistence", backend, tmp_path)
    # every run left all of it behind (so the attack was real) and none found it
    assert "persistence: left /run/lock, /dev/shm, /tmp, /var/tmp, message queue, shared memory, semaphore set" \
        in output, output[-2000:]
    assert "found what an earlier run left" not in output
    assert _host_leftovers() == []


@needs_isolation
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_neighbour_in_a_batch_finds_nothing_and_the_reference_passes(backend, tmp_path):
    submissions = tmp_path / "batch"
    shutil.copytree(corpus.REFERENCE, submissions / "reference", ignore=shutil.ignore_patterns("__pycache__"))
    ENTRIES["neighbour"].materialize(submissions / "neighbour")
    out = tmp_path / "gradebook.json"
    done = subprocess.run([sys.executable, "-m", "retrylab", "grade-batch", str(submissions), "--jobs", "2",
                           "--backend", backend, "--out", str(out), "--isolation", "required"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = {row["id"]: row for row in json.loads(out.read_text())["submissions"]}
    for name in ("reference", "neighbour"):
        assert rows[name]["status"] == "pass", rows[name]
