"""Hostile submissions that attack the private Redis and, through it, the grader (fixtures/submissions/hostile):
Lua escapes, an admin lockout, a memory bomb. Each is graded on the fake backend and on redis-server, in a
subprocess (so that its peak memory is the grading's own), and must get its expected verdict with no harness
error, leave no marker of an escape, print no "ESCAPED", and keep the grading process under 1 GB."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from retrylab.fixtures.backoff_dlq import corpus

NAMES = ["lua-python-bridge", "lua-os-execute", "lua-io-open", "lua-require", "lua-load", "admin-lockout",
         "redis-memory-bomb"]
ENTRIES = {e.name: e for e in corpus.entries("hostile") if e.name in NAMES}
PEAK_LIMIT_KB = 1024 * 1024          # the grading process stays under 1 GB whatever the learner writes

GRADE = """
import json, sys
from retrylab.grading import grade
report = grade(sys.argv[1], backend=sys.argv[2])
print(json.dumps({"lab": {r.number: r.status for r in report.lab_results},
                  "errors": [r.name for r in report.results if r.status == "error"],
                  "harness_error": report.harness_error,
                  "messages": {r.name: r.message[:400] for r in report.results if not r.passed},
                  "output": "\\n".join(r.output for r in report.results),
                  # VmHWM, not ru_maxrss: ru_maxrss keeps the size of the forking pytest worker across exec
                  "peak_kb": next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))}))
"""


def test_every_fixture_is_there():
    assert sorted(ENTRIES) == sorted(NAMES)


@pytest.mark.parametrize("backend", ["fake", "redis-server"])
@pytest.mark.parametrize("name", NAMES)
def test_attacks_on_the_server_do_not_reach_the_grader(name, backend, tmp_path):
    entry = ENTRIES[name]
    marker = Path(f"/tmp/retrylab-escaped-{name}")
    marker.unlink(missing_ok=True)
    submission = entry.materialize(tmp_path / "submission")
    done = subprocess.run([sys.executable, "-c", GRADE, str(submission), backend], capture_output=True, text=True,
                          timeout=entry.max_seconds + 60)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    explain = json.dumps(result["messages"], indent=1, ensure_ascii=False)[:4000]
    assert {int(k): v for k, v in result["lab"].items()} == entry.expect, f"{entry.why}\n{explain}"
    assert not result["harness_error"] and not result["errors"], explain
    assert not marker.exists(), f"{marker} was written: a script ran outside Redis' Lua sandbox"
    assert "ESCAPED" not in result["output"], result["output"][-2000:]
    assert result["peak_kb"] < PEAK_LIMIT_KB, f"the grading process peaked at {result['peak_kb'] // 1024} MiB"
