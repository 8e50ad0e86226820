"""`retrylab watch` as a learner saw it (issue 16): editors' temporary files are not changes, every
failing step has a line and the advanced checks one, and long lines wrap at spaces."""
from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import pytest

from retrylab import exercise as exercises
from retrylab import bidi, i18n
from retrylab.commands import UsageError, watch
from retrylab.commands.watch import Watcher, wrap
from retrylab.results import StepResult

from test_explain_watch import WatchProcess, submission  # noqa: F401 - a fixture

EXERCISE = exercises.get("backoff-dlq")


@pytest.mark.parametrize("name", ["sedXsogPM", "4913", "#worker.py#", "worker.py~", ".worker.py.swp",
                                  "schedule.txt.tmp", ".goutputstream-ABC123"])
def test_editor_temporaries_are_not_changes(name):
    assert watch.is_editor_temporary(name)


@pytest.mark.parametrize("name", ["worker.py", "schedule.txt", "replay.py", "sed_notes.txt", "seds.py"])
def test_submission_files_are_changes(name):
    assert not watch.is_editor_temporary(name)


def _step(number: int, status: str = "pass", message: str = "") -> StepResult:
    step = EXERCISE.step(number)
    return StepResult(name=step.slug, title=step.title, status=status, number=number, message=message)


def test_every_failing_step_has_a_line_and_the_advanced_checks_one(monkeypatch):
    args = argparse.Namespace(directory=Path("."), backend="fake", clear="never", exercise=EXERCISE.id)
    watcher = Watcher(args, EXERCISE, "en", out=open(os.devnull, "w"))
    monkeypatch.setattr(watcher, "columns", lambda: 60)
    hint = "Hint: " + " ".join(["schedule.txt holds six lines attempt=<n> wait=<s>"] * 4)
    watcher.results = {n: _step(n) for n in range(1, 9)}
    watcher.results[1] = _step(1, "fail", "worker.py exited with status 1\n" + hint)
    watcher.results[3] = _step(3, "fail", "schedule.txt should have 6 lines")
    watcher.advanced = (StepResult(name="advanced:backoff-applied", title="t", status="fail", kind=exercises.ADVANCED),
                        StepResult(name="advanced:dlq-alert", title="t", status="pass", kind=exercises.ADVANCED))
    lines = watcher.summary()
    assert "6/8 steps pass" in lines
    assert "FAIL step 1: worker consumes q:tasks" in lines and "FAIL step 3: exponential backoff schedule" in lines
    assert "advanced checks (optional): 1/2 pass; not yet: backoff-applied" in lines
    message = [line for line in lines if line.startswith("    ")]
    assert len(message) > 2 and all(bidi.width(line) <= 60 for line in message), message
    assert " ".join(line.strip() for line in message) == "worker.py exited with status 1 " + hint  # no word cut


@pytest.mark.parametrize("lang", ["en", "fa", "zh"])
def test_wrap_breaks_at_spaces_within_the_width_and_keeps_isolates_whole(lang):
    line = "    " + i18n.label("report.could_not_grade", lang, error="could not start a Redis container "
                               "(redis:7-alpine): lookup registry-1.docker.io: server misbehaving " * 2)
    parts = wrap(line, 50)
    assert len(parts) > 1 and all(p.startswith("    ") for p in parts)
    for part in parts:
        assert not bidi.bidi_problems(part), part
        assert bidi.width(part) <= 50 or any(c in bidi.BIDI_CONTROLS for c in part)
    if lang == "en":
        assert " ".join(p.strip() for p in parts) == line.strip()


def test_watch_ignores_seds_temporary_and_lists_every_failing_step(submission):  # noqa: F811
    watch_process = WatchProcess(submission)
    try:
        watch_process.frame(lambda f: "8/8 steps pass" in f and "checking" not in f)
        subprocess.run(["sed", "-i", "s/wait=2/wait=3/", str(submission / "schedule.txt")], check=True)
        with (submission / "worker.py").open("a") as f:
            f.write("\ndef broken(:\n")
        frame = watch_process.frame(lambda f: "checking" not in f and "3/8 steps pass" in f)
        assert "sed" not in frame.split("changed:")[1].splitlines()[0], frame
        assert "FAIL step 1:" in frame and "FAIL step 3:" in frame, frame
        assert "advanced checks (optional):" in frame
        assert watch_process.interrupt() == 0
    finally:
        watch_process.kill()


def test_a_folder_removed_while_watched_ends_the_watch_in_one_line(tmp_path):
    gone = tmp_path / "mine"
    args = argparse.Namespace(directory=gone, backend="fake", clear="never", exercise=EXERCISE.id)
    watcher = Watcher(args, EXERCISE, "en", out=open(os.devnull, "w"))
    with pytest.raises(UsageError, match="mine is no longer a directory"):
        watcher.regrade(["worker.py"])
