"""Grading a submission that floods the application channel keeps the grader's memory bounded: the
run is stopped after MAX_CALLS calls or MAX_RECORD_BYTES of records, each record's id, argument and
error are bounded, and nothing the learner sends is kept whole. Measured as the peak RSS of a grading
in a subprocess of its own."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from retrylab.fixtures.backoff_dlq import corpus
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE

PEAK_RSS_BOUND = 300 << 20      # bytes; a grading of the reference takes about 50 MB here
_MEASURE = """
import json, sys
from retrylab.grading import grade
# the lab's steps only: the advanced checks' own worker run would be a second flood beside the first, and on a
# busy machine (CI here) the two together no longer reach the call cap within the run's 15 s
report = grade(sys.argv[1], backend=sys.argv[2], steps=tuple(range(1, 9)))
print(json.dumps({"verdicts": {r.number: r.status for r in report.lab_results},
                  "messages": {r.number: r.message for r in report.lab_results},
                  # VmHWM, not ru_maxrss: ru_maxrss keeps the size of the process that forked this one
                  # (a pytest worker grown to hundreds of MB) across exec
                  "peak": next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) * 1024}))
"""


def _grade_in_subprocess(submission, backend: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(submission), backend], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", ["fake", "redis-server"])
def test_a_call_flood_is_stopped_and_the_graders_memory_stays_bounded(backend, tmp_path):
    entry = next(e for e in corpus.entries("hostile") if e.name == "call-flood")
    flood = _grade_in_subprocess(entry.materialize(tmp_path / "submission"), backend)
    assert {int(k): v for k, v in flood["verdicts"].items()} == entry.expect
    for step in ("1", "6", "7"):
        assert "more than 10000 calls" in flood["messages"][step], flood["messages"][step]
    reference = _grade_in_subprocess(REFERENCE, backend)
    assert flood["peak"] < PEAK_RSS_BOUND, (flood["peak"] >> 20, reference["peak"] >> 20)


def test_calls_with_huge_ids_are_stopped_by_the_records_budget_and_the_graders_memory_stays_bounded(tmp_path):
    # on main the ids and the errors quoting them were kept whole: 1.3 GB for step 1 alone
    entry = next(e for e in corpus.entries("hostile") if e.name == "huge-id-flood")
    flood = _grade_in_subprocess(entry.materialize(tmp_path / "submission"), "fake")
    assert {int(k): v for k, v in flood["verdicts"].items()} == entry.expect
    for step in ("1", "6", "7"):
        assert "MB of ids, arguments and error texts" in flood["messages"][step], flood["messages"][step]
    assert flood["peak"] < PEAK_RSS_BOUND, flood["peak"] >> 20
