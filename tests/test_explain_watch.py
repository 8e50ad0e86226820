"""`retrylab explain N`, `retrylab watch DIR` and the plain-text plots in check messages."""
from __future__ import annotations

import argparse
import codecs
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from helpers import default_sigint
from retrylab import exercise as exercises
from retrylab import bidi, i18n, plots
from retrylab.cli import main
from retrylab.commands.watch import CLEAR, Watcher
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE

EXERCISE = exercises.get("backoff-dlq")
FORMULAS = {"exponential": "wait = base * 2**attempt", "capped": "wait = min(cap, base * 2**attempt)",
            "jitter": "wait = random.uniform(0, min(cap, base * 2**attempt))"}


# --------------------------------------------------------------------------------------------
# explain


def _explain(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["explain", *args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("lang", i18n.LANGUAGES)
@pytest.mark.parametrize("number, formulas", [(3, ["exponential"]), (4, ["exponential", "jitter"]),
                                              (5, ["exponential", "capped"])])
def test_explain_prints_goal_formulas_and_hint_in_the_language(capsys, lang, number, formulas):
    status, out, _ = _explain(capsys, str(number), "--lang", lang)
    assert status == 0
    catalog = i18n.exercise_catalog(EXERCISE)
    step = EXERCISE.step(number)
    assert catalog.text(f"steps.{step.slug}.title", lang) in out
    assert catalog.text(f"steps.{step.slug}.goal", lang) in out
    assert catalog.text(f"steps.{step.slug}.hint", lang) in out
    assert i18n.label("explain.formulas", lang) in out
    for name in formulas:
        assert FORMULAS[name] in out
    assert [name for name in FORMULAS if FORMULAS[name] in out] == formulas  # only those it relies on
    assert bidi.bidi_problems(out) == []
    if lang == "fa":
        assert all(line.startswith(bidi.LRM) for line in out.splitlines() if line.strip() in FORMULAS.values())


def test_explain_a_step_without_formulas_and_an_advanced_check(capsys):
    status, out, _ = _explain(capsys, "1", "--lang", "en")
    assert status == 0 and "Formulas" not in out and "Goal" in out and "Hint" in out and "worker.py" in out
    status, out, _ = _explain(capsys, "backoff-applied", "--lang", "ru")
    assert status == 0 and FORMULAS["capped"] in out and FORMULAS["jitter"] in out
    assert i18n.exercise_catalog(EXERCISE).text("advanced.backoff-applied.hint", "ru") in out


def test_explain_without_a_step_lists_them_and_the_locale_picks_the_language(capsys, monkeypatch):
    monkeypatch.setenv("LANGUAGE", "zh")
    status, out, _ = _explain(capsys)
    assert status == 0
    for step in EXERCISE.steps:
        assert i18n.label("report.step", "zh", number=step.number) + ": " + \
            i18n.exercise_catalog(EXERCISE).text(f"steps.{step.slug}.title", "zh") in out


def test_explain_an_unknown_step_is_a_one_line_usage_error(capsys):
    status, out, err = _explain(capsys, "9", "--lang", "en")
    assert status == 2 and out == ""
    assert err.strip() == "retrylab: no step 9 in backoff-dlq (steps are 1-8)"


# --------------------------------------------------------------------------------------------
# plots


def _bar(row: str) -> str:
    return row[row.index("|") + 1:row.rindex("|")]


def test_value_bars_show_each_value_against_the_band():
    chart = plots.value_bars([2, 8, 9.5, -1, None, 0], band=(0, 8), scale=(0, 8),
                             notes=["", "", "above 8", "negative", "not a number", ""])
    axis, *rows = chart.splitlines()
    assert len(rows) == 6 and axis.split() == ["0", "8"]
    assert all(len(_bar(row)) == plots.WIDTH for row in rows)
    assert _bar(rows[0]) == "#" * 8 + "." * 24 and rows[0].endswith(" 2")
    assert _bar(rows[1]) == "#" * 32
    assert "|>" in rows[2] and rows[2].endswith("9.5  above 8")
    assert "<|" in rows[3] and "#" not in rows[3] and rows[3].endswith("-1  negative")
    assert "?" in rows[4] and rows[4].endswith("?  not a number")
    assert _bar(rows[5]) == "." * 32
    assert chart.isascii()


def test_value_bars_mark_the_part_past_the_band():
    values = [1, 2, 4, 8, 16, 32, 64, 30, 30]
    chart = plots.value_bars(values, band=(0, 30), scale=(0, 32), labels=[str(n) for n in range(9)])
    rows = chart.splitlines()[1:]
    assert [("!" in _bar(r)) for r in rows] == [False] * 5 + [True, True, False, False]
    assert _bar(rows[0]).endswith("  ")         # outside the band: blank
    assert "|>" in rows[6] and "|>" not in rows[5]


def test_value_bars_are_bounded():
    chart = plots.value_bars([1.0] * 55, band=(0, 8), scale=(0, 8))
    lines = chart.splitlines()
    assert len(lines) == 1 + plots.MAX_ROWS + 1 and lines[-1].strip() == "+15"


def _watcher() -> Watcher:
    args = argparse.Namespace(directory=Path("."), backend="fake", clear="never", exercise=EXERCISE.id)
    return Watcher(args, EXERCISE, "en", out=open(os.devnull, "w"))


@pytest.mark.parametrize("changed, first", [
    (["schedule.txt"], [3]),
    (["worker.py"], [1, 2, 6, 7]),
    (["replay.py"], [8]),
    (["requeue.out"], [2]),
    (["jitter.txt", "capped.txt"], [4, 5]),
    (["notes.md"], []),
])
def test_watch_rechecks_first_the_steps_that_read_a_changed_file(changed, first):
    watcher = _watcher()
    got_first, rest = watcher.order(changed)
    assert got_first == first
    assert sorted(got_first + rest) == list(range(1, 9))


# --------------------------------------------------------------------------------------------
# watch: a real process, edited files, Ctrl-C


def _descendants(root: int) -> dict[int, bytes]:
    """pid -> start time of every process below `root` (found through /proc parent links)."""
    parents, started = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        started[int(entry)] = fields[19]
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = started[pid]
                frontier.append(pid)
    return found


def _alive(processes: dict[int, bytes]) -> list[int]:
    alive = []
    for pid, start in processes.items():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == start and fields[0] != b"Z":
            alive.append(pid)
    return alive


def _marked(mark: str) -> list[int]:
    """Processes whose environment carries `mark` (inherited from the watch process)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


class WatchProcess:
    """`retrylab watch` as a learner runs it, read frame by frame: each summary is one write that
    starts with the clear-screen sequence (--clear always), so a frame is the text between two."""

    def __init__(self, submission: Path):
        self.mark = uuid.uuid4().hex
        env = dict(os.environ, LC_RETRYLAB_WATCH_TEST=self.mark, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "retrylab", "watch", str(submission), "--lang", "en", "--debounce", "100",
             "--clear", "always"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            preexec_fn=default_sigint)   # as a learner's terminal starts it, whoever started the tests
        self.text = ""
        self.ended = False
        self.seen = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        decoder = codecs.getincrementaldecoder("utf-8")()
        while chunk := os.read(self.proc.stdout.fileno(), 65536):
            self.text += decoder.decode(chunk)
        self.ended = True

    def frames(self) -> list[str]:
        return [frame for frame in self.text.split(CLEAR)[1:] if frame.endswith("\n")]

    def frame(self, predicate, limit: float = 90.0) -> str:
        """The first frame not returned yet for which predicate(frame) holds."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            frames = self.frames()
            for index in range(self.seen, len(frames)):
                if predicate(frames[index]):
                    self.seen = index + 1
                    return frames[index]
            if self.ended:
                break
            time.sleep(0.05)
        raise AssertionError(f"no such frame; the last ones: {self.frames()[-3:]}")

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=60)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def submission(tmp_path) -> Path:
    folder = tmp_path / "submission"
    shutil.copytree(REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def _settle(processes: dict[int, bytes], mark: str) -> tuple[list[int], list[int]]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_alive(processes) or _marked(mark)):
        time.sleep(0.1)
    return _alive(processes), _marked(mark)


def test_watch_regrades_on_change_redraws_and_stops_cleanly_on_ctrl_c(submission):
    good_schedule = (submission / "schedule.txt").read_text()
    (submission / "schedule.txt").write_text("attempt=0 wait=1\nattempt=1 wait=3\n")
    watch = WatchProcess(submission)
    try:
        first = watch.frame(lambda f: "steps pass" in f and "checking" not in f)
        assert "7/8 steps pass" in first
        assert "FAIL step 3: exponential backoff schedule" in first
        assert "schedule.txt should have 6 lines" in first and "Hint:" in first

        (submission / "schedule.txt").write_text(good_schedule)
        checking = watch.frame(lambda f: "changed: schedule.txt" in f and "checking steps" in f)
        assert checking.rstrip().endswith("checking steps 3 ...")           # the step that reads it first
        watch.frame(lambda f: "checking steps 1, 2, 4, 5, 6, 7, 8 ..." in f)  # then the rest
        done = watch.frame(lambda f: "checking" not in f)
        assert "8/8 steps pass" in done and "every step passes" in done

        with (submission / "worker.py").open("a") as f:
            f.write("\n# edited\n")
        checking = watch.frame(lambda f: "changed: worker.py" in f and "checking steps" in f)
        assert checking.rstrip().endswith("checking steps 1, 2, 6, 7 ...")
        watch.frame(lambda f: "checking steps 3, 4, 5, 8 ..." in f)
        assert "8/8 steps pass" in watch.frame(lambda f: "checking" not in f)

        below = _descendants(watch.proc.pid)
        assert watch.interrupt() == 0
        while not watch.ended:
            time.sleep(0.05)
        assert watch.text.rstrip().endswith(f"stopped watching {submission}")
        assert "Traceback" not in watch.proc.stderr.read().decode()
        assert _settle(below, watch.mark) == ([], [])
    finally:
        watch.kill()


def test_ctrl_c_while_grading_stops_the_learners_processes_too(submission):
    watch = WatchProcess(submission)
    try:
        watch.frame(lambda f: "checking steps 1, 2, 3" in f)
        below: dict[int, bytes] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the worker of step 1 is running
            below = _descendants(watch.proc.pid)
            if any(pid != watch.proc.pid for pid in below):
                break
            time.sleep(0.01)
        assert below, "the grading never started a learner process"
        assert watch.interrupt() == 0
        assert "Traceback" not in watch.proc.stderr.read().decode()
        assert _settle(below, watch.mark) == ([], [])
    finally:
        watch.kill()


def test_watch_refuses_a_missing_directory_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "retrylab", "watch", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == f"retrylab: {tmp_path / 'nope'} is not a directory"
