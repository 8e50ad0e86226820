"""Warm start (retrylab.warmstart, retrylab.learner_template): a learner script forked from the template behaves as
it would in a cold interpreter, holds nothing of the template's, shows its run's environment in /proc, and stops
when the harness goes; a dead template is replaced."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from helpers import alive, scripts_folder, wait_until
from retrylab import procfs, sandbox, warmstart
from retrylab.sandbox import Sandbox

DETECTED = sandbox.containment()
pytestmark = pytest.mark.skipif(not warmstart.enabled(), reason="no pidfd_open here: runs start cold")
# both ways a warm run is contained: in namespaces of its own (unshare(2)), and without (partial isolation)
VARIANTS = {"unshare": dataclasses.replace(DETECTED, namespaces="unshare", bwrap=""),
            "no-namespaces": dataclasses.replace(DETECTED, namespaces="", bwrap="")}

BEHAVIOUR = """
    import atexit, json, os, sys, threading, time
    facts = {"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
             "cwd": os.getcwd() == os.path.dirname(__file__), "home": os.environ["HOME"].endswith("/home"),
             "given": os.environ.get("GIVEN"), "site": os.environ.get("RETRYLAB_SITE_ACTIVE"),
             "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
             "environ_shown": b"GIVEN=yes" in open("/proc/self/environ", "rb").read()}
    print(json.dumps(facts), flush=True)
    atexit.register(lambda: print("atexit ran", flush=True))
    def late():
        time.sleep(0.2)
        print("thread finished", flush=True)
    threading.Thread(target=late).start()
    how = sys.argv[1]
    if how == "exit-3":
        sys.exit(3)
    if how == "exit-text":
        sys.exit("stopping: bad config")
    if how == "raise":
        def deep():
            raise ValueError("boom")
        deep()
    if how == "interrupt":
        raise KeyboardInterrupt
"""


def _run(folder: Path, containment, warm: bool, monkeypatch, *args: str, script: str = "behave.py"):
    monkeypatch.setenv(warmstart.WARM_VARIABLE, "1" if warm else "0")
    with Sandbox(folder, containment=containment) as box:
        return box.run(script, env={"GIVEN": "yes"}, timeout=30, args=args)


def _comparable(result) -> tuple:
    lines = result.stdout.splitlines()
    facts = json.loads(lines[0])
    facts.pop("fds")   # compared on their own below
    facts["file"], facts["path0"] = Path(facts["file"]).name, Path(facts["path0"]).name  # each run its own copy
    return result.returncode, facts["argv"], facts["name"], Path(facts["file"]).name, facts, lines[1:], \
        [line for line in result.stderr.splitlines() if "retrylab-run-" not in line]


@pytest.mark.parametrize("kind", sorted(VARIANTS))
@pytest.mark.parametrize("how", ["returns", "exit-3", "exit-text", "raise", "interrupt"])
def test_a_warm_run_behaves_as_a_cold_one(kind, how, tmp_path, monkeypatch):
    folder = scripts_folder(tmp_path, behave=BEHAVIOUR)
    warm = _run(folder, VARIANTS[kind], True, monkeypatch, how)
    cold = _run(folder, VARIANTS[kind], False, monkeypatch, how)
    assert _comparable(warm) == _comparable(cold), (warm, cold)
    facts = json.loads(warm.stdout.splitlines()[0])
    assert facts["path0"].endswith("/submission") and facts["cwd"] and facts["home"] and facts["site"] == "1"
    assert facts["environ_shown"], "/proc/self/environ does not show the run's environment"
    assert "atexit ran" in warm.stdout and "thread finished" in warm.stdout
    expected = {"returns": 0, "exit-3": 3, "exit-text": 1, "raise": 1, "interrupt": -signal.SIGINT}[how]
    assert warm.returncode == expected, warm
    if how == "raise":  # the traceback starts at the script, as python prints it
        assert warm.stderr.startswith("Traceback (most recent call last):\n  File \"") and "behave.py" in \
            warm.stderr.splitlines()[1], warm.stderr
        assert "learner_template" not in warm.stderr


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_a_warm_script_holds_no_descriptor_of_the_template_or_the_harness(kind, tmp_path, monkeypatch):
    folder = scripts_folder(tmp_path, behave=BEHAVIOUR)
    warm = _run(folder, VARIANTS[kind], True, monkeypatch, "returns")
    cold = _run(folder, VARIANTS[kind], False, monkeypatch, "returns")
    fds = [json.loads(r.stdout.splitlines()[0])["fds"] for r in (warm, cold)]
    assert fds[0] == fds[1] and fds[0][:3] == [0, 1, 2], fds


def test_a_script_that_does_not_exist_fails_as_python_says(tmp_path, monkeypatch):
    folder = scripts_folder(tmp_path, other="print(1)")
    warm = _run(folder, VARIANTS["unshare"], True, monkeypatch, script="missing.py")
    assert warm.returncode == 2 and "can't open file" in warm.stderr and "missing.py" in warm.stderr


def test_a_syntax_error_is_reported_as_python_reports_it(tmp_path, monkeypatch):
    folder = scripts_folder(tmp_path, broken="def f(:\n    pass\n")
    warm = _run(folder, VARIANTS["unshare"], True, monkeypatch, script="broken.py")
    assert warm.returncode == 1 and "SyntaxError" in warm.stderr and "broken.py" in warm.stderr
    assert "learner_template" not in warm.stderr


def test_a_dead_template_is_replaced_and_the_run_still_happens(tmp_path, monkeypatch):
    folder = scripts_folder(tmp_path, hello="print('hello')")
    monkeypatch.setenv(warmstart.WARM_VARIABLE, "1")
    with Sandbox(folder, containment=VARIANTS["unshare"]) as box:
        assert box.run("hello.py", env={}, timeout=30).stdout == "hello\n"
        old = warmstart.template(box.learner_imports, Sandbox.template_environment())
        os.kill(old.pid, signal.SIGKILL)
        wait_until(lambda: not old.alive(), "the template to die", timeout=10)
        result = box.run("hello.py", env={}, timeout=30)
        assert result.stdout == "hello\n" and result.returncode == 0, result
        assert warmstart.template(box.learner_imports, Sandbox.template_environment()).pid != old.pid


# waits without the virtual clock (whose sleeps end when the harness that keeps the clock is gone), and prints
# nothing (a print to the dead harness's pipe would end it too)
SLEEPER = "import signal\nsignal.pause()\n"
HARNESS = """
import sys, pathlib
from retrylab.sandbox import Sandbox
from retrylab.containment import Containment
import dataclasses, json
containment = Containment(**json.loads(sys.argv[2]))
with Sandbox(pathlib.Path(sys.argv[1]), containment=containment) as box:
    box.run("sleeper.py", env={}, timeout=120)
"""


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_a_killed_harness_takes_its_warm_runs_with_it(kind, tmp_path):
    """The run's supervisor is the template's child, so the harness's death reaches it through the lifeline
    (and the template's own end), not through a parent-death signal."""
    tag = f"warm-{uuid.uuid4().hex}"
    folder = scripts_folder(tmp_path, sleeper=SLEEPER)
    fields = dataclasses.asdict(VARIANTS[kind])
    fields["cgroups"], fields["notes"] = list(fields["cgroups"]), list(fields["notes"])
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(folder), json.dumps(fields)],
                               env={**os.environ, sandbox.RUN_TAG_VARIABLE: tag, warmstart.WARM_VARIABLE: "1"},
                               start_new_session=True)
    try:
        wait_until(lambda: procfs.find_processes(tag), "the warm run to start", timeout=30)
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait()
        wait_until(lambda: not [p for p in procfs.find_processes(tag) if alive(p)],
                   "the run's processes to end with the harness", timeout=15)
    finally:
        if harness.poll() is None:
            os.killpg(harness.pid, signal.SIGKILL)


def test_a_fork_of_the_harness_does_not_talk_to_its_parents_template_unless_shared():
    imports = ("json",)
    first = warmstart.template(imports, Sandbox.template_environment())
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            mine = warmstart.template(imports, Sandbox.template_environment())
            os.write(write, str(mine.pid).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    answer = os.read(read, 32)
    os.close(read)
    assert answer and int(answer) != first.pid


SHARING_HARNESS = """
import os, sys, pathlib, time, json
from retrylab import warmstart
from retrylab.sandbox import Sandbox
from retrylab.containment import Containment
containment = Containment(**json.loads(sys.argv[2]))
warmstart.template((), Sandbox.template_environment())
warmstart.share_with_forks()            # as grade-batch's warm process does
child = os.fork()
if child == 0:
    with Sandbox(pathlib.Path(sys.argv[1]), containment=containment) as box:
        box.run("sleeper.py", env={}, timeout=120)
    os._exit(0)
print(child, flush=True)
time.sleep(120)
"""


def test_a_killed_grading_takes_its_runs_with_it_though_the_shared_template_lives_on(tmp_path):
    """grade-batch: the template belongs to the warm process, which outlives the grading it forked. A grading
    killed (its time limit) must not leave its runs going: the lifeline tells their supervisors."""
    tag = f"warm-{uuid.uuid4().hex}"
    folder = scripts_folder(tmp_path, sleeper=SLEEPER)
    fields = dataclasses.asdict(VARIANTS["unshare"])
    fields["cgroups"], fields["notes"] = list(fields["cgroups"]), list(fields["notes"])
    warm = subprocess.Popen([sys.executable, "-c", SHARING_HARNESS, str(folder), json.dumps(fields)],
                            env={**os.environ, sandbox.RUN_TAG_VARIABLE: tag, warmstart.WARM_VARIABLE: "1"},
                            stdout=subprocess.PIPE, start_new_session=True)
    run = f"{sandbox.RUN_ID_VARIABLE}={tag}"   # the warm process has the tag in its environment too
    try:
        grading = int(warm.stdout.readline())
        wait_until(lambda: procfs.find_processes(run), "the warm run to start", timeout=30)
        os.kill(grading, signal.SIGKILL)
        wait_until(lambda: not [p for p in procfs.find_processes(run) if alive(p)],
                   "the run's processes to end with their grading", timeout=15)
        assert warm.poll() is None, "the warm process (and its template) should still be there"
    finally:
        os.killpg(warm.pid, signal.SIGKILL)
        warm.wait()


TAMPER = """
    import json, os, sys
    print(hasattr(json, "RETRYLAB_TAMPERED"), flush=True)
    json.RETRYLAB_TAMPERED = True                  # in this run's copy of the template's memory only
    template = int(sys.argv[1])
    try:
        os.kill(template, 9)                         # the template is root's, and in no namespace of the run
        print("killed", flush=True)
    except OSError as exc:
        print(type(exc).__name__, flush=True)
"""


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_a_run_cannot_change_or_stop_the_template_the_next_run_comes_from(kind, tmp_path, monkeypatch):
    if not VARIANTS[kind].unprivileged_uid:
        pytest.skip("the run has no uid of its own here: it shares the harness's")
    folder = scripts_folder(tmp_path, tamper=TAMPER)
    monkeypatch.setenv(warmstart.WARM_VARIABLE, "1")
    with Sandbox(folder, containment=VARIANTS[kind], warm_imports=()) as box:
        template = warmstart.template((), Sandbox.template_environment())   # the one the runs fork from
        first = box.run("tamper.py", env={}, timeout=30, args=(str(template.pid),))
        second = box.run("tamper.py", env={}, timeout=30, args=(str(template.pid),))
    for result in (first, second):
        assert result.returncode == 0, result.stderr
        tampered, kill = result.stdout.split()
        assert tampered == "False" and kill in ("PermissionError", "ProcessLookupError"), result.stdout
    assert template.alive()


def test_what_a_broker_lets_the_template_import_is_among_its_learner_imports():
    from retrylab import brokers
    for kind in ("redis", "nats", "kafka"):
        broker = brokers.get(kind)
        assert set(broker.warm_imports) <= set(broker.learner_imports), kind
    assert "confluent_kafka" not in brokers.get("kafka").warm_imports  # its redirect must come first


# As a child subreaper: run a process that starts a template and exits, then say which orphans it left us.
_LEFT_BEHIND = r"""
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)     # PR_SET_CHILD_SUBREAPER
starter = ("from retrylab import warmstart; from retrylab.sandbox import Sandbox; "
           "print(warmstart.template(('redis',), Sandbox.template_environment()).pid)")
template = int(subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, check=True).stdout)
time.sleep(0.5)
orphans = []
while True:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if not pid:
        break
    orphans.append(pid)
print(template, orphans)
"""


def test_a_process_reaps_the_templates_it_started_when_it_exits():
    """Else the template is reaped by init, and with it the CPU of every run it forked goes uncounted by
    whoever timed the grading (a benchmark, `time`, a grading service's accounting)."""
    done = subprocess.run([sys.executable, "-c", _LEFT_BEHIND], capture_output=True, text=True, timeout=120)
    template, orphans = done.stdout.split(" ", 1)
    assert orphans.strip() == "[]", done.stdout + done.stderr
    assert not alive(int(template))
