"""The `retrylab` command as graders and learners call it: formats, exit statuses, bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from retrylab.fixtures.backoff_dlq.corpus import REFERENCE


def retrylab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrylab", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_reference_text_report_lists_every_step_and_a_tally(tmp_path):
    done = retrylab("check", str(REFERENCE), cwd=tmp_path)  # from any directory
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for number in range(1, 9):
        assert any(line.startswith("PASS") and f"step {number}:" in line for line in lines)
    assert "8/8 steps pass" in done.stdout


def test_exercism_format_is_only_results_json_on_stdout():
    done = retrylab("check", str(REFERENCE), "--format", "exercism", "--step", "3", "--step", "1")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert results["version"] == 3 and results["status"] == "pass"
    assert [t["task_id"] for t in results["tests"]] == [1, 3]
    assert all(t["status"] == "pass" and t["name"] for t in results["tests"])


def test_empty_directory_fails_every_step_with_a_message_and_no_traceback(tmp_path):
    done = retrylab("check", str(tmp_path), "--format", "exercism")
    assert done.returncode == 1, done.stderr
    results = json.loads(done.stdout)
    assert results["status"] == "fail"
    lab = [t for t in results["tests"] if "task_id" in t]
    assert [t["task_id"] for t in lab] == list(range(1, 9))
    assert [t["status"] for t in lab] == ["fail"] * 8
    for test in lab:
        assert "missing" in test["message"], test
    assert "Traceback" not in done.stdout + done.stderr


def test_output_file_and_exit_zero(tmp_path):
    out = tmp_path / "results.json"
    done = retrylab("check", str(tmp_path), "--format", "exercism", "--output", str(out), "--exit-zero",
                    "--step", "3")
    assert done.returncode == 0 and done.stdout == ""
    assert json.loads(out.read_text())["tests"][0]["status"] == "fail"


@pytest.mark.parametrize("args, reason", [
    (["check", "/no/such/dir"], "is not a directory"),
    (["check", ".", "--step", "9"], "no step 9"),
])
def test_harness_cannot_grade_exits_2_with_one_line(args, reason):
    done = retrylab(*args)
    assert done.returncode == 2
    assert reason in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_missing_redis_server_binary_exits_2_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "retrylab", "check", str(REFERENCE), "--backend", "redis-server"],
                          capture_output=True, text=True, env={"PATH": str(tmp_path)}, timeout=60)
    assert done.returncode == 2
    assert "redis-server is not on PATH" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_plain_pytest_runs_the_same_checks():
    checks = Path(__import__("retrylab.checks", fromlist=["x"]).__file__).parent / "backoff_dlq"
    done = subprocess.run([sys.executable, "-m", "pytest", str(checks), "--solution", str(REFERENCE),
                           "--backend", "fake", "-p", "no:randomly", "-q"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    lab_checks = len(list(checks.glob("test_step*.py"))) + 1  # step 2 has two checks
    advanced_checks = len(list(checks.glob("test_advanced_*.py")))
    assert f"{lab_checks + advanced_checks} passed" in done.stdout


def test_a_failed_check_does_not_repr_what_its_fixtures_hold(tmp_path):
    """pytest's default traceback shows each frame's arguments through repr(): a shared run holding a
    learner's 20 MB value would be expanded for every failed check (seen: 5 s and 800 MB a grading)."""
    checks = tmp_path / "checks"
    checks.mkdir()
    (checks / "test_huge.py").write_text(
        "import pytest\nfrom retrylab.verdict import CheckFailed\n"
        "import pathlib\nclass Huge:\n    def __repr__(self):\n"
        f"        pathlib.Path({str(tmp_path / 'repr-called')!r}).touch()\n        return 'Huge'\n"
        "@pytest.fixture(scope='session')\ndef huge():\n    return Huge()\n"
        "def test_fails(huge):\n    raise CheckFailed('expected this, observed that')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", str(checks), "-p", "retrylab.plugin", "-p", "no:randomly",
                           "-p", "no:cacheprovider", "--solution", str(REFERENCE), "-q", "--rootdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "1 failed" in done.stdout, done.stdout + done.stderr
    assert "expected this, observed that" in done.stdout
    assert not (tmp_path / "repr-called").exists()
