"""Per-step time limits: an over-time step fails alone, saying so; the other steps still run; no
learner process is left running; every step records how long it took."""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from retrylab.fixtures.backoff_dlq.corpus import REFERENCE
from retrylab import exercise as exercises
from retrylab.grading import grade, pytest_args
from retrylab.limits import StepClock, StepTimeLimit
from retrylab.procfs import find_processes
from retrylab.sandbox import RUN_ID_VARIABLE, Sandbox

# Learner scripts that never finish; each first prints its pid (the sandbox may run it as another
# user, so it cannot write to the test's files). TICK changes Redis every second (a blocking pop
# waits in real time), so no "quiet for a while" stop condition ends it before the step's limit
# does, at almost no CPU; BUSY only burns CPU.
TICK = """import os, redis
print("learner-pid=%d run=%s" % (os.getpid(), os.environ["RETRYLAB_RUN_ID"]), flush=True)
r = redis.Redis()
while True:
    r.rpush("tick", 1)
    r.blpop("nothing-comes", timeout=1)
"""
BUSY = """import os
print("learner-pid=%d run=%s" % (os.getpid(), os.environ["RETRYLAB_RUN_ID"]), flush=True)
while True:
    pass
"""


def _submission(tmp_path: Path, script: str, code: str) -> Path:
    folder = tmp_path / "submission"
    shutil.copytree(REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
    (folder / script).write_text(code)
    return folder


def _assert_gone(output: str) -> None:
    # by its run's id in the environment: in a PID namespace of its own the pid it prints is not the host's
    runs = set(re.findall(r"learner-pid=\d+ run=(\S+)", output))
    assert runs, "the script did not start"
    for run in runs:
        assert find_processes(f"{RUN_ID_VARIABLE}={run}") == [], f"a process of run {run} is still running"


def _outputs(report) -> str:
    return "\n".join(r.output for r in report.results)


def _by_number(report) -> dict:
    return {r.number: r for r in report.lab_results}


def test_a_replay_that_never_exits_fails_step_8_alone_for_its_limit(tmp_path):
    folder = _submission(tmp_path, "replay.py", TICK)
    report = grade(folder, step_timeout=5)
    steps = _by_number(report)
    assert steps[8].status == "fail"
    assert "step 8 did not finish within its 5 s limit" in steps[8].message
    assert "replay.py was still running" in steps[8].message
    assert "Hint:" in steps[8].message
    assert {n: r.status for n, r in steps.items() if n != 8} == {n: "pass" for n in range(1, 8)}
    assert not report.harness_error and report.exit_status() == 1
    assert all(r.seconds > 0 for r in report.lab_results)  # every step records its duration
    assert steps[8].seconds >= 4  # it ran up to its limit
    _assert_gone(steps[8].output)


def test_a_worker_that_never_settles_fails_the_step_that_runs_it_and_no_harness_error(tmp_path):
    folder = _submission(tmp_path, "worker.py", TICK)
    report = grade(folder, step_timeout=5)
    steps = _by_number(report)
    # the shared worker run is part of the first step that uses it (step 1)...
    assert steps[1].status == "fail"
    assert "step 1 did not finish within its 5 s limit: worker.py was still running" in steps[1].message
    # ...the other steps that read it judge what it did before it was stopped, as verdicts, not errors
    for number in (2, 6, 7):
        assert steps[number].status == "fail", steps[number]
        assert "within its" not in steps[number].message
    assert {n: steps[n].status for n in (3, 4, 5, 8)} == {3: "pass", 4: "pass", 5: "pass", 8: "pass"}
    assert not report.harness_error and report.exit_status() == 1
    _assert_gone(_outputs(report))


def test_step_timeout_on_the_command_line(tmp_path):
    folder = _submission(tmp_path, "replay.py", TICK)
    # alone, step 8 also pays for the worker run that makes its DLQ entry
    done = subprocess.run([sys.executable, "-m", "retrylab", "check", str(folder), "--format", "exercism",
                           "--step-timeout", "6", "--step", "3", "--step", "8"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    tests = {t["task_id"]: t for t in json.loads(done.stdout)["tests"]}
    assert tests[3]["status"] == "pass"
    assert tests[8]["status"] == "fail"
    assert tests[8]["message"].startswith("step 8 did not finish within its 6 s limit: ")
    assert "was still running when the limit was reached" in tests[8]["message"]
    _assert_gone(tests[8].get("output", ""))


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e10", "86401"])
def test_a_step_timeout_that_is_not_a_positive_number_up_to_a_day_is_a_usage_error(value):
    # 1e10 and inf overflowed time_t inside the grading: every step a harness defect
    done = subprocess.run([sys.executable, "-m", "retrylab", "check", str(REFERENCE), "--step-timeout", value],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--step-timeout" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["inf", "1e10"])
def test_a_step_timeout_beyond_a_day_is_refused_under_plain_pytest_too(value):
    done = subprocess.run([sys.executable, "-m", "pytest", *pytest_args(exercises.get("backoff-dlq")),
                           "--solution", str(REFERENCE), "--step-timeout", value, "-p", "no:randomly",
                           "-p", "no:cacheprovider"],   # else a cache lands in checks/
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 4 and "at most 86400" in done.stderr, done.stdout + done.stderr


def _spin_until_interrupted(limit: float = 30.0) -> None:
    end = time.monotonic() + limit  # a safety net; the clock stops this long before
    while time.monotonic() < end:
        pass


def test_the_alarm_stops_check_code_that_overruns_and_is_cancelled_after():
    clock = StepClock()
    before = signal.getsignal(signal.SIGALRM)
    with pytest.raises(StepTimeLimit) as caught:
        with clock.phase(4, "step 4", 0.3):
            _spin_until_interrupted()
    assert caught.value.message == "step 4 did not finish within its 0.3 s limit."
    assert caught.value.key == 4
    assert clock.over(4, 0.3)
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_alarm_waits_while_a_learner_run_stops_itself_then_fires():
    clock = StepClock()
    interrupted_inside = False
    with pytest.raises(StepTimeLimit):
        with clock.phase(6, "step 6", 0.2):
            try:
                with clock.shielded():
                    end = time.monotonic() + 0.6
                    while time.monotonic() < end:  # past the deadline: the alarm must not interrupt this
                        pass
            except StepTimeLimit:
                interrupted_inside = True
            _spin_until_interrupted()
    assert not interrupted_inside


def test_a_step_limit_is_shared_by_the_checks_of_one_step():
    clock = StepClock(override=1.0)
    with clock.phase(2, "step 2", 1.0):
        time.sleep(0.3)
    with clock.phase(2, "step 2", 1.0):
        left = clock.remaining()
    assert left is not None and left <= 0.71
    assert clock.remaining() is None  # outside a phase nothing is limited
    assert not clock.over(2, 1.0)


def _running(script: str) -> list[int]:
    """Pids of live processes whose command line names `script`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if script.encode() in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


def test_an_interrupted_run_leaves_no_learner_process(tmp_path):
    script = f"hang_{uuid.uuid4().hex}.py"  # a name no other process has
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / script).write_text(BUSY)
    seen = []

    def interrupt() -> bool:
        seen.extend(_running(script))
        if seen:
            raise KeyboardInterrupt  # e.g. a step's alarm, or Ctrl-C, while the sandbox waits
        return False

    with Sandbox(folder) as box, pytest.raises(KeyboardInterrupt):
        box.run(script, env={}, timeout=60, stop_when=interrupt)
    assert seen  # it was running when the run was interrupted
    assert _running(script) == []
