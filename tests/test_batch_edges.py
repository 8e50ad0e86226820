"""grade-batch's rough edges (issue 16): what counts as a submission, a gradebook path that cannot be
written, the feedback in the gradebook, the file mode of what it writes."""
from __future__ import annotations

import csv
import json
import os
import stat
import subprocess
import sys

import pytest

from retrylab import batch
from retrylab.fixtures.backoff_dlq import corpus

ENTRIES = {e.id: e for e in corpus.entries()}


def grade_batch(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrylab", "grade-batch", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_hidden_and_tool_folders_are_not_submissions(tmp_path):
    for name in ("alice", "bob", "__pycache__", ".git", ".venv", "node_modules"):
        (tmp_path / name).mkdir()
    (tmp_path / "notes.txt").write_text("not a folder")
    assert [s.id for s in batch.discover(tmp_path)] == ["alice", "bob"]


def test_one_submission_given_as_the_batch_is_refused(tmp_path):
    submission = ENTRIES["wrong/schedule-short"].materialize(tmp_path / "mine")
    done = grade_batch(submission, "--out", tmp_path / "gb.csv", timeout=60)
    assert done.returncode == 2 and "looks like one submission" in done.stderr and "worker.py" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "gb.csv").exists()


def test_a_directory_without_submissions_is_refused(tmp_path):
    (tmp_path / "subs" / "__pycache__").mkdir(parents=True)
    done = grade_batch(tmp_path / "subs", "--out", tmp_path / "gb.csv", timeout=60)
    assert done.returncode == 2 and "no submission in" in done.stderr
    assert not (tmp_path / "gb.csv").exists()


def test_a_gradebook_in_a_missing_directory_is_refused_not_created(tmp_path):
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    done = grade_batch(tmp_path / "subs", "--out", tmp_path / "nowhere" / "gb.csv", timeout=60)
    assert done.returncode == 2 and "does not exist" in done.stderr
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_gradebooks_and_journal_follow_the_umask(tmp_path, umask, mode):
    config = batch.BatchConfig()
    sub = batch.Submission("alice", tmp_path)
    previous = os.umask(umask)
    try:
        batch.write_gradebook(tmp_path / "gb.csv", [batch.error_row(sub, "x", 0.0, config)], config)
        batch.BatchState(tmp_path / "gb.state.jsonl").record(sub, "h", config, {"status": "error"})
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "gb.csv").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "gb.state.jsonl").stat().st_mode) == mode


def test_the_gradebook_holds_why_each_step_failed(tmp_path):
    ids = ["wrong/schedule-short", "wrong/jitter-constant"]
    for entry_id in ids:
        ENTRIES[entry_id].materialize(tmp_path / "subs" / ENTRIES[entry_id].name)
    out = tmp_path / "gb.json"
    done = grade_batch(tmp_path / "subs", "--out", out, "--jobs", "2")
    assert done.returncode == 0, done.stderr
    rows = {r["id"]: r for r in json.loads(out.read_text())["submissions"]}
    short, constant = rows["schedule-short"], rows["jitter-constant"]
    lab = {k for k in short["feedback"] if k.startswith("step")}
    assert lab == {"step3_schedule"} and "Hint:" in short["feedback"]["step3_schedule"]
    assert {k for k in constant["feedback"] if k.startswith("step")} == {"step4_jitter"}
    # the CSV, written from the same rows, carries the first line of each message
    batch.write_gradebook(tmp_path / "gb.csv", list(rows.values()), batch.BatchConfig())
    with (tmp_path / "gb.csv").open(newline="") as f:
        cells = {r["id"]: r["feedback"] for r in csv.DictReader(f)}
    first_line = short["feedback"]["step3_schedule"].splitlines()[0]
    assert f"step3_schedule: {' '.join(first_line.split())}" in cells["schedule-short"]
    assert "step4_jitter: " in cells["jitter-constant"]


def test_feedback_cell_is_bounded_and_escapes_control_characters():
    cell = batch.feedback_cell({"step1_worker": "\x1b[2Jpainted\nsecond line", "step2_requeue": "x" * 5000})
    assert "\x1b" not in cell and cell.startswith("step1_worker: \\x1b[2Jpainted | step2_requeue: xxx")
    assert len(cell) <= batch.FEEDBACK_LIMIT


def test_a_batch_configs_backend_is_its_exercises_default_unless_one_is_chosen():
    """The engine names no backend: a config made without one takes the exercise's broker's default."""
    from retrylab import brokers
    from retrylab import exercise as exercises
    for exercise_id in exercises.exercises():
        default = brokers.get(exercises.get(exercise_id).broker).default_backend
        assert batch.BatchConfig(exercise_id=exercise_id).backend == default
    assert batch.BatchConfig(backend="redis-server").backend == "redis-server"
