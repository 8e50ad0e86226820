"""grade-batch where the file system says no: a gradebook folder or journal that cannot be written, a batch folder
that cannot be read, a submission folder whose name is not UTF-8, a corrupt journal. Each is one line and exit
status 2 before any grading (a traceback's exit status 1 reads as a verdict in CI), or graded as any other."""
from __future__ import annotations

import csv
import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from retrylab import batch
from retrylab import exercise as exercises
from retrylab.commands import grade_batch as grade_batch_command

REFERENCE = Path(__file__).resolve().parents[1] / "solution" / "backoff-dlq"
# root's capabilities that bypass file modes: without them root is refused as any other grader would be
NO_DAC_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                   "--inh-caps=-dac_override,-dac_read_search"]
BAD_NAME = b"bad\xffname"   # not UTF-8: Python sees it as 'bad\udcffname'


def as_grader() -> list[str]:
    """The prefix that runs a command as a grader without root's file-mode overrides."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to run without root's file-mode overrides")
    return NO_DAC_OVERRIDE


def grade_batch(*args, prefix: list[str] = (), timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "retrylab", "grade-batch", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def refused(done: subprocess.CompletedProcess, reason: str) -> bool:
    """Exit status 2 with one line saying `reason`, no traceback."""
    lines = done.stderr.strip().splitlines()
    return done.returncode == 2 and len(lines) == 1 and reason in lines[0] and "Traceback" not in done.stderr


def a_batch(root: Path) -> Path:
    (root / "subs").mkdir()
    shutil.copytree(REFERENCE, root / "subs" / "alice")
    return root / "subs"


def graded(done: subprocess.CompletedProcess) -> tuple[int, int, int]:
    found = re.search(r"(\d+) graded, (\d+) unchanged, (\d+) error", done.stderr)
    assert found, done.stderr
    return tuple(int(n) for n in found.groups())


def test_an_unwritable_gradebook_folder_is_refused_before_any_grading(tmp_path):
    prefix = as_grader()
    subs, readonly = a_batch(tmp_path), tmp_path / "ro"
    readonly.mkdir(mode=0o555)
    if subprocess.run([*prefix, "touch", readonly / "probe"], capture_output=True).returncode == 0:
        pytest.skip("this grader can write in a mode 555 folder")
    done = grade_batch(subs, "--out", readonly / "g.csv", prefix=prefix)
    assert refused(done, f"cannot create files in {readonly}: permission denied"), done.stderr


def test_a_gradebook_where_no_file_can_be_created_is_refused_before_any_grading(tmp_path):
    done = grade_batch(a_batch(tmp_path), "--out", "/proc/x.csv")
    assert refused(done, "cannot create files in /proc"), done.stderr


def test_a_directory_in_the_journals_place_is_refused(tmp_path):
    (tmp_path / "g.csv.state.jsonl").mkdir()
    done = grade_batch(a_batch(tmp_path), "--out", tmp_path / "g.csv")
    assert refused(done, "g.csv.state.jsonl: is a directory"), done.stderr
    assert not (tmp_path / "g.csv").exists()


def test_checking_the_gradebook_leaves_nothing_behind(tmp_path):
    batch.check_writable(tmp_path / "g.csv")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "g.csv.state.jsonl").write_text("kept\n")
    batch.check_writable(tmp_path / "g.csv")
    assert [p.name for p in tmp_path.iterdir()] == ["g.csv.state.jsonl"]
    assert (tmp_path / "g.csv.state.jsonl").read_text() == "kept\n"


@pytest.mark.parametrize("mode", [0o000, 0o444, 0o111], ids=["no-access", "no-search", "no-listing"])
def test_an_unreadable_batch_folder_is_one_line(tmp_path, mode):
    prefix = as_grader()
    subs = a_batch(tmp_path)
    subs.chmod(mode)
    try:
        done = grade_batch(subs, "--out", tmp_path / "g.csv", prefix=prefix)
    finally:
        subs.chmod(0o755)
    assert refused(done, f"cannot read {subs}: permission denied"), done.stderr


def test_a_gradebook_under_a_file_says_it_is_not_a_directory(tmp_path):
    (tmp_path / "afile").write_text("")
    done = grade_batch(a_batch(tmp_path), "--out", tmp_path / "afile" / "x.json")
    assert refused(done, f"{tmp_path / 'afile'} is a file, not a directory"), done.stderr


def test_a_gradebook_in_a_folder_this_grader_may_not_look_into_is_one_line(tmp_path):
    prefix = as_grader()
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o000)
    try:
        done = grade_batch(a_batch(tmp_path), "--out", closed / "g.csv", prefix=prefix)
    finally:
        closed.chmod(0o755)
    assert refused(done, f"--out {closed / 'g.csv'}: permission denied"), done.stderr


@pytest.mark.parametrize("args, reason", [
    (["--step-timeout", "1e10"], "--step-timeout 1e+10: give a number of seconds above 0 and at most"),
    (["--timeout", "inf"], "--timeout inf: give a number of seconds above 0 and at most"),
    (["--out", ""], "an empty path"),
], ids=["step-timeout-overflows", "timeout-infinite", "empty-out"])
def test_limits_and_paths_check_wants_are_refused_here_too(tmp_path, args, reason):
    # the last --out wins: where a limit is not refused, the gradebook stays out of the checkout
    done = grade_batch(a_batch(tmp_path), "--out", tmp_path / "g.csv", *args)
    assert done.returncode == 2 and reason in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_an_empty_batch_folder_argument_is_refused_not_the_current_folder(tmp_path):
    done = subprocess.run([sys.executable, "-m", "retrylab", "grade-batch", "", "--out", tmp_path / "g.csv"],
                          capture_output=True, text=True, timeout=60, cwd=a_batch(tmp_path))
    assert done.returncode == 2 and "an empty path" in done.stderr, done.stderr
    assert not (tmp_path / "g.csv").exists()


def test_a_submission_not_named_in_utf8_is_graded_and_resumed(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copytree(REFERENCE, os.fsdecode(os.fsencode(subs) + b"/" + BAD_NAME))
    out = tmp_path / "g.csv"
    first = grade_batch(subs, "--out", out)
    assert first.returncode == 0 and graded(first) == (1, 0, 0), first.stderr
    with out.open(newline="", encoding="utf-8") as f:
        (row,) = csv.DictReader(f)
    assert row["id"] == r"bad\xffname" and row["status"] == "pass", row
    again = grade_batch(subs, "--out", out)   # the journal knows it by the same id
    assert again.returncode == 0 and graded(again) == (0, 1, 0), again.stderr


def test_two_folders_with_the_same_id_are_refused(tmp_path):
    subs = tmp_path / "subs"
    os.makedirs(os.fsencode(subs) + b"/" + BAD_NAME)
    (subs / r"bad\xffname").mkdir()   # the other one's id, spelt out
    done = grade_batch(subs, "--out", tmp_path / "g.csv")
    assert refused(done, r"bad\xffname"), done.stderr


def test_text_that_is_not_utf8_is_written_readable_in_gradebooks_and_journal(tmp_path):
    config = batch.BatchConfig()
    sub = batch.Submission("ada", tmp_path)
    row = batch.error_row(sub, "cannot read bad\udcffname", 0.0, config) | {"feedback": {"step1_worker": "x\udcff"}}
    assert row["reason"] == r"cannot read bad\xffname"
    state = batch.BatchState(tmp_path / "g.csv.state.jsonl")
    state.record(sub, "h", config, row)
    batch.write_gradebook(tmp_path / "g.csv", [row], config)
    batch.write_gradebook(tmp_path / "g.json", [row], config)
    assert r"bad\xffname" in (tmp_path / "g.csv").read_text(encoding="utf-8")
    assert json.loads((tmp_path / "g.json").read_text(encoding="utf-8"))["submissions"][0]["reason"] == row["reason"]
    assert batch.BatchState(state.path).records["ada"]["row"]["feedback"] == row["feedback"]


@pytest.mark.parametrize("line", [
    {"id": "ada", "hash": "h", "row": ["pass"]},
    {"id": "ada", "hash": "h", "row": "pass"},
    {"id": ["ada"], "hash": "h", "row": {"status": "pass"}},
    ["ada", "h"],
], ids=["row-a-list", "row-a-string", "id-a-list", "record-a-list"])
def test_a_corrupt_journal_line_is_ignored_and_graded_again(tmp_path, line):
    config = batch.BatchConfig()
    sub = batch.Submission("ada", tmp_path)
    path = tmp_path / "g.csv.state.jsonl"
    if isinstance(line, dict):
        line = line | {"config": config.fingerprint()}
    path.write_text(json.dumps(line) + "\n")
    assert batch.BatchState(path).reusable(sub, "h", config) is None


@pytest.mark.parametrize("inside", [".", "reports"])
def test_a_gradebook_inside_a_submission_is_refused(tmp_path, inside):
    # every run of alice's scripts got a copy of the class's grades, and her submission changed with each grading
    subs = a_batch(tmp_path)
    (subs / "alice" / inside).mkdir(exist_ok=True)
    out = subs / "alice" / inside / "grades.csv"
    assert refused(grade_batch(subs, "--out", out), "is inside the submission alice")
    assert not out.exists()


def test_shards_sharing_a_gradebook_keep_each_others_grades(tmp_path):
    subs = a_batch(tmp_path)
    other = next(f"s{n}" for n in range(100) if batch.shard_of(f"s{n}", 2) != batch.shard_of("alice", 2))
    shutil.copytree(REFERENCE, subs / other)
    out = tmp_path / "grades.csv"
    for shard in ("1/2", "2/2"):
        done = grade_batch(subs, "--out", out, "--shard", shard)
        assert done.returncode == 0 and graded(done) == (1, 0, 0), done.stderr
    # the second shard's run dropped the first's journal records: alice or the other was graded again here
    done = grade_batch(subs, "--out", out)
    assert done.returncode == 0 and graded(done) == (0, 2, 0), done.stderr
    with out.open(newline="") as f:
        assert sorted(row["id"] for row in csv.DictReader(f)) == sorted(["alice", other])


def test_an_empty_shard_is_refused_not_taken_for_the_whole_batch(tmp_path):
    # a CI matrix whose shard variable is unset graded every submission in every job
    subs = a_batch(tmp_path)
    assert refused(grade_batch(subs, "--out", tmp_path / "g.csv", "--shard", ""), "expected I/N")


def test_ids_a_spreadsheet_or_a_terminal_would_act_on_are_written_inert(tmp_path):
    # a folder's name is the learner's to choose (an unzipped archive): a formula ran in the grader's spreadsheet,
    # an ESC sequence reached the grader's terminal, and a lone CR split the row, crediting the grades to "PASS"
    subs = tmp_path / "subs"
    subs.mkdir()
    names = ['=HYPERLINK("evil.example","x")', "-2+3", "a\x1b]0;PWNED\x07b\rPASS"]
    for name in names:
        shutil.copytree(REFERENCE, subs / name)
    out = tmp_path / "grades.csv"
    done = grade_batch(subs, "--out", out)
    assert done.returncode == 0, done.stderr
    raw = out.read_bytes()
    assert not re.search(rb"[\x00-\x08\x0b-\x1f\x7f]", raw), raw
    with out.open(newline="") as f:
        ids = sorted(row["id"] for row in csv.DictReader(f))
    assert ids == sorted(["'=HYPERLINK(\"evil.example\",\"x\")", "'-2+3", "a\\x1b]0;PWNED\\x07b\\rPASS"]), ids


@pytest.mark.parametrize("names, shown", [(["=x", "'=x"], "'=x"), (["a\x1bb", "a\\x1bb"], "a\\x1bb")],
                         ids=["formula", "control"])
def test_two_folders_that_would_share_a_csv_cell_are_refused(tmp_path, names, shown):
    # one cell would stand for both: a spreadsheet showed two rows a grader could not tell apart
    for name in names:
        (tmp_path / "subs" / name).mkdir(parents=True)   # refused before any grading: empty folders will do
    done = grade_batch(tmp_path / "subs", "--out", tmp_path / "g.csv")
    assert refused(done, f"would both be {shown} in the gradebook: rename one"), done.stderr
    assert all(repr(name) in done.stderr for name in names), done.stderr   # both named, told apart
    assert "\x1b" not in done.stderr and not (tmp_path / "g.csv").exists()
    # the JSON gradebook keeps ids as they are: two ids there
    exercise = exercises.get("backoff-dlq")
    assert len(grade_batch_command._check_submissions(tmp_path / "subs", exercise, tmp_path / "g.json")) == 2


@pytest.mark.parametrize("lang, said", [("en", "no space left on device; the batch stopped, and the grade recorded "
                                                 "before is kept"),
                                         ("ru", "пакетная проверка остановлена, записанная раньше 1 оценка "
                                                "сохранена")])
def test_grades_that_can_no_longer_be_saved_stop_the_batch_and_say_what_is_kept(tmp_path, monkeypatch, lang, said):
    # a disk filling up mid-batch: every queued grading still ran, then a traceback (exit 1)
    subs = a_batch(tmp_path)
    for name in ("bob", "carol", "dave"):
        shutil.copytree(REFERENCE, subs / name)
    recorded, graded = [], []

    def record(self, submission, digest, config, row):
        if recorded:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        recorded.append(submission.id)

    grade = batch.grade_in_subprocess

    def counted(*args, **kwargs):
        graded.append(args[0].id)
        return grade(*args, **kwargs)

    monkeypatch.setattr(batch.BatchState, "record", record)
    monkeypatch.setattr(batch, "grade_in_subprocess", counted)
    config = batch.BatchConfig(step_timeout=None, warm=False, lang=lang)
    with pytest.raises(batch.GradesNotSaved, match=said):
        batch.run_batch(batch.discover(subs), config, tmp_path / "g.csv")
    assert len(graded) <= 3, graded      # the one recorded, the one that could not be, at most one started
    assert not (tmp_path / "g.csv").exists()


def test_grades_kept_after_a_failed_record_count_those_reused_from_the_journal(tmp_path, monkeypatch):
    # a resumed batch whose first new record failed said "the 0 grades recorded before are kept"
    subs = a_batch(tmp_path)
    config = batch.BatchConfig(step_timeout=None, warm=False)
    batch.run_batch(batch.discover(subs), config, tmp_path / "g.csv")
    (subs / "bob").mkdir()

    def full(self, submission, digest, config, row):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(batch.BatchState, "record", full)
    with pytest.raises(batch.GradesNotSaved, match="the batch stopped, and the grade recorded before is kept"):
        batch.run_batch(batch.discover(subs), config, tmp_path / "g.csv")


def test_a_gradebook_that_cannot_be_written_says_where_the_grades_are(tmp_path, monkeypatch):
    subs = a_batch(tmp_path)

    def full(out, rows, config):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(batch, "write_gradebook", full)
    config = batch.BatchConfig(step_timeout=None, warm=False, lang="zh")
    with pytest.raises(batch.GradesNotSaved) as stopped:
        batch.run_batch(batch.discover(subs), config, tmp_path / "g.csv")
    said = str(stopped.value)
    assert said.startswith(f"无法写入 {tmp_path / 'g.csv'} 或其日志") and "no space left on device" in said, said
    assert f"成绩保存在 {tmp_path / 'g.csv.state.jsonl'} 中" in said, said
    assert '"alice"' in (tmp_path / "g.csv.state.jsonl").read_text()


def test_a_torn_journal_line_spoils_no_later_record(tmp_path, monkeypatch):
    # a write the disk took only part of was counted as recorded, and the next record, appended right after
    # the torn bytes, could not be read back either
    config = batch.BatchConfig(warm=False)
    journal = tmp_path / "g.csv.state.jsonl"
    row = {"id": "alice", "status": "pass"}
    state = batch.BatchState(journal)
    real_write = os.write
    monkeypatch.setattr(batch.os, "write", lambda fd, data: real_write(fd, data[:10]))
    with pytest.raises(OSError):
        state.record(batch.Submission("alice", tmp_path), "h1", config, row)
    monkeypatch.setattr(batch.os, "write", real_write)
    state.record(batch.Submission("bob", tmp_path), "h2", config, {**row, "id": "bob"})
    assert set(batch.BatchState(journal).records) == {"bob"}
    batch.BatchState(journal).record(batch.Submission("carol", tmp_path), "h3", config, {**row, "id": "carol"})
    assert set(batch.BatchState(journal).records) == {"bob", "carol"}
    journal.write_bytes(journal.read_bytes() + b'{"id": "da')            # a crash's torn line, then a resume
    batch.BatchState(journal).record(batch.Submission("erin", tmp_path), "h4", config, {**row, "id": "erin"})
    assert set(batch.BatchState(journal).records) == {"bob", "carol", "erin"}
