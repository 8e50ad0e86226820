"""`retrylab grade-batch`: a gradebook of many submissions, graded in parallel, resumable, shardable;
one submission's crash or hang never stops the batch."""
from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import default_sigint
from retrylab import batch
from retrylab.fixtures.backoff_dlq import corpus

MIX = ["correct/envelope-format", "correct/blpop-forever-default-client", "wrong/schedule-short",
       "wrong/replay-keeps-attempts", "wrong/worker-drops-failed", "wrong/empty-directory"]
ENTRIES = {e.id: e for e in corpus.entries()}
STEPS = {1: "step1_worker", 2: "step2_requeue", 3: "step3_schedule", 4: "step4_jitter", 5: "step5_cap",
         6: "step6_dlq", 7: "step7_dlq-record", 8: "step8_replay"}


def grade_batch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrylab", "grade-batch", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def materialize(root: Path, ids: list[str]) -> Path:
    for entry_id in ids:
        entry = ENTRIES[entry_id]
        entry.materialize(root / entry.name)
    return root


def read_csv(path: Path) -> dict[str, dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return {row["id"]: row for row in csv.DictReader(f)}


def read_json(path: Path) -> dict[str, dict]:
    return {row["id"]: row for row in json.loads(path.read_text(encoding="utf-8"))["submissions"]}


def summary(done: subprocess.CompletedProcess) -> tuple[int, int, int]:
    found = re.search(r"(\d+) graded, (\d+) unchanged, (\d+) error", done.stderr)
    assert found, done.stderr
    return tuple(int(n) for n in found.groups())


def test_a_batch_grades_every_submission_with_its_expected_verdicts(tmp_path):
    submissions = materialize(tmp_path / "submissions", MIX)
    out = tmp_path / "gradebook.csv"
    done = grade_batch(submissions, "--jobs", "2", "--out", out)
    assert done.returncode == 0, done.stderr
    assert summary(done) == (6, 0, 0)
    rows = read_csv(out)
    assert sorted(rows) == sorted(ENTRIES[i].name for i in MIX)
    for entry_id in MIX:
        entry, row = ENTRIES[entry_id], rows[ENTRIES[entry_id].name]
        assert {n: row[column] for n, column in STEPS.items()} == entry.expect, (entry_id, row)
        passed = sum(v == "pass" for v in entry.expect.values())
        assert float(row["score"]) == pytest.approx(passed / 8)
        assert row["status"] == ("pass" if passed == 8 else "fail")
        assert float(row["seconds"]) > 0 and row["harness_version"] and row["backend"] == "fake"
    assert batch.state_path(out).is_file()


def test_a_rerun_skips_unchanged_submissions_and_regrades_a_changed_one(tmp_path):
    ids = ["correct/envelope-format", "wrong/schedule-short", "wrong/empty-directory"]
    submissions = materialize(tmp_path / "submissions", ids)
    out = tmp_path / "gradebook.json"
    first = grade_batch(submissions, "--jobs", "2", "--out", out)
    assert first.returncode == 0, first.stderr
    before = read_json(out)

    again = grade_batch(submissions, "--jobs", "2", "--out", out)
    assert again.returncode == 0 and summary(again) == (0, 3, 0)
    assert read_json(out) == before  # the same rows, seconds included: nothing was graded again

    (submissions / "envelope-format" / "schedule.txt").write_text("attempt=0 wait=1\n")
    changed = grade_batch(submissions, "--jobs", "2", "--out", out)
    assert changed.returncode == 0 and summary(changed) == (1, 2, 0)
    after = read_json(out)
    assert after["envelope-format"]["step3_schedule"] == "fail"
    assert after["envelope-format"]["score"] == pytest.approx(7 / 8)
    assert {k: v for k, v in after.items() if k != "envelope-format"} == \
        {k: v for k, v in before.items() if k != "envelope-format"}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "ci-cancel"])
def test_an_interrupted_batch_resumes_where_it_stopped(tmp_path, signum):
    submissions = tmp_path / "submissions"
    for n in range(4):
        (submissions / f"learner-{n}").mkdir(parents=True)
    out = tmp_path / "gradebook.csv"
    proc = subprocess.Popen([sys.executable, "-m", "retrylab", "grade-batch", str(submissions), "--jobs", "1",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as from a terminal, even if this test runs where SIGINT is ignored
                            preexec_fn=default_sigint)
    state = batch.state_path(out)
    while proc.poll() is None and not (state.exists() and state.read_bytes().count(b"\n") >= 1):
        time.sleep(0.05)
    proc.send_signal(signum)  # after the first submission was recorded
    _, stderr = proc.communicate(timeout=120)
    if proc.returncode == 0:  # it finished before the signal arrived: nothing was interrupted
        pytest.fail(f"the batch ended before it could be interrupted: {stderr}")
    assert proc.returncode == 130, stderr
    assert "run the same command again to resume" in stderr
    done_before = len(read_csv(out))
    assert 1 <= done_before < 4
    resumed = grade_batch(submissions, "--jobs", "2", "--out", out)
    assert resumed.returncode == 0, resumed.stderr
    graded, unchanged, errors = summary(resumed)
    assert unchanged == done_before and graded == 4 - done_before and errors == 0
    assert sorted(read_csv(out)) == [f"learner-{n}" for n in range(4)]


def test_shards_partition_the_batch(tmp_path):
    submissions = tmp_path / "submissions"
    for n in range(6):  # empty submissions grade fastest; the split is by name
        (submissions / f"learner-{n}").mkdir(parents=True)
    seen = []
    for shard in ("1/2", "2/2"):
        out = tmp_path / f"shard-{shard[0]}.csv"
        done = grade_batch(submissions, "--jobs", "2", "--shard", shard, "--out", out)
        assert done.returncode == 0, done.stderr
        rows = read_csv(out)
        assert all(row["status"] == "fail" for row in rows.values())
        seen.append(set(rows))
    assert seen[0] | seen[1] == {f"learner-{n}" for n in range(6)}
    assert not seen[0] & seen[1]


def test_shard_assignment_is_stable_and_a_partition():
    names = [f"student-{n:03}" for n in range(200)]
    subs = [batch.Submission(n, Path(n)) for n in names]
    shards = [batch.select(subs, (i, 3)) for i in (1, 2, 3)]
    assert sorted(s.id for part in shards for s in part) == names
    assert all(len(part) > 30 for part in shards)  # roughly even
    # a submission keeps its shard when others join the batch
    assert [s.id for s in batch.select(subs[:50], (2, 3))] == [s.id for s in shards[1] if s.id in names[:50]]


def _running(marker: str) -> list[int]:
    """Live processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_hanging_grading_gives_an_error_row_and_the_batch_continues(tmp_path):
    submissions = materialize(tmp_path / "submissions", ["correct/envelope-format"])
    hang = ENTRIES["correct/envelope-format"].materialize(submissions / "hangs")
    marker = f"spinning-{uuid.uuid4().hex}"
    # re-executes itself with a marker in its command line (so this test can find it), then changes
    # Redis every second (a blocking pop waits in real time), so the worker runs never settle; each
    # takes its full 15 s (RUN_TIMEOUT, from the worker's own start), which always outlasts a
    # per-submission wall limit of 14 s: that limit counts from when the grading process is up, before
    # the worker starts, so a busy machine's slow interpreter start does not use it up. A correct
    # submission stays well under it (about 2 s on a quiet machine).
    (hang / "worker.py").write_text(
        f"import os, sys, redis\nif sys.argv[1:] != [{marker!r}]:\n"
        f"    os.execv(sys.executable, [sys.executable, sys.argv[0], {marker!r}])\n"
        "r = redis.Redis()\nwhile True:\n    r.rpush('tick', 1)\n    r.blpop('nothing-comes', timeout=1)\n")
    out = tmp_path / "gradebook.csv"
    proc = subprocess.Popen([sys.executable, "-m", "retrylab", "grade-batch", str(submissions), "--jobs", "2",
                             "--timeout", "14", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen = []
    while proc.poll() is None and not seen:
        seen = _running(marker)
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=300)
    assert seen, "the spinning worker never ran"
    assert proc.returncode == 0, stderr
    assert _running(marker) == []  # the learner's process went with its grading
    rows = read_csv(out)
    assert rows["hangs"]["status"] == "error"
    assert rows["hangs"]["reason"] == "grading did not finish within 14 s and was stopped"
    assert rows["hangs"]["score"] == ""
    assert rows["envelope-format"]["status"] == "pass", rows["envelope-format"]
    # an error is not a grade: the next run grades it again (and reuses the pass)
    state = batch.BatchState(batch.state_path(out))
    config = batch.BatchConfig()
    for sub in batch.discover(submissions):
        reused = state.reusable(sub, batch.content_hash(sub.path), config)
        assert (reused is None) == (sub.id == "hangs")


@pytest.mark.parametrize("script, reason", [
    ("echo 'grader exploded' >&2; exit 3", "the grading process exited with status 3 without a report: grader exploded"),
    ("kill -9 $$", "the grading process was killed by SIGKILL without a report"),
])
def test_a_grading_process_that_dies_gives_an_error_row(tmp_path, monkeypatch, script, reason):
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!/bin/sh\n{script}\n")
    fake_python.chmod(0o755)
    monkeypatch.setattr(batch.sys, "executable", str(fake_python))
    (tmp_path / "work").mkdir()
    sub = batch.Submission("someone", tmp_path)
    row = batch.grade_in_subprocess(sub, batch.BatchConfig(), tmp_path / "work")
    assert row["status"] == "error" and row["id"] == "someone"
    assert row["reason"] == reason
    assert row["score"] is None


def test_the_wall_limit_counts_from_when_the_grading_process_is_up(tmp_path, monkeypatch):
    # a "python" that takes 2 s to start (a busy machine), then reports at once: a 1 s limit
    # counted from its start would call it hung; counted from when it is up, its report is the row
    fake_python = tmp_path / "python"
    fake_python.write_text('#!/bin/bash\nsleep 2\nfd="${@: -1}"\necho 1 >&"$fd"\n'
                           'echo \'{"results": [], "harness_error": "reported"}\' > "$4"\n')
    fake_python.chmod(0o755)
    monkeypatch.setattr(batch.sys, "executable", str(fake_python))
    (tmp_path / "work").mkdir()
    row = batch.grade_in_subprocess(batch.Submission("slow-start", tmp_path), batch.BatchConfig(timeout=1.0),
                                    tmp_path / "work")
    assert row["reason"] == "reported"


def test_content_hash_covers_relative_paths_and_bytes_but_not_caches(tmp_path):
    folder = tmp_path / "s"
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "a.py").write_text("x = 1\n")
    first = batch.content_hash(folder)
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "a.pyc").write_bytes(b"\0")
    assert batch.content_hash(folder) == first  # the sandbox never copies it: it cannot change a grade
    (folder / "pkg" / "a.py").write_text("x = 2\n")
    assert batch.content_hash(folder) != first
    (folder / "pkg" / "a.py").write_text("x = 1\n")
    assert batch.content_hash(folder) == first
    (folder / "pkg" / "a.py").rename(folder / "pkg" / "b.py")
    assert batch.content_hash(folder) != first


def test_the_state_journal_survives_a_torn_last_line(tmp_path):
    state = batch.BatchState(tmp_path / "gb.csv.state.jsonl")
    sub = batch.Submission("ada", tmp_path)
    config = batch.BatchConfig()
    row = batch.error_row(sub, "x", 1.0, config) | {"status": "pass", "score": 1.0}
    state.record(sub, "h1", config, row)
    with state.path.open("ab") as f:
        f.write(b'{"id": "bob", "hash": "h2", "con')  # the batch was killed mid-write
    reloaded = batch.BatchState(state.path)
    assert reloaded.reusable(sub, "h1", config) == row
    assert reloaded.reusable(sub, "h2", config) is None  # content changed
    assert reloaded.reusable(sub, "h1", batch.BatchConfig(backend="redis-server")) is None  # config changed
    assert "bob" not in reloaded.records


@pytest.mark.parametrize("args, reason", [
    (["--shard", "3/2"], "--shard 3/2"),
    (["--shard", "half"], "expected I/N"),
    (["--jobs", "0"], "--jobs must be at least 1"),
    (["--out", "gradebook.txt"], ".csv or .json"),
    (["--timeout", "0"], "--timeout 0"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, reason):
    done = grade_batch(tmp_path, *args, timeout=60)
    assert done.returncode == 2
    assert reason in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_missing_directory_exits_2(tmp_path):
    done = grade_batch(tmp_path / "nope", "--out", tmp_path / "gb.csv", timeout=60)
    assert done.returncode == 2 and "is not a directory" in done.stderr
    assert not (tmp_path / "gb.csv").exists()
