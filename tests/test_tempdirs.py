"""Temporary folders carry their maker's pid: what a grading killed outright left is removed by the
next one, and nothing else is."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from retrylab import tempdirs


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_folders_of_a_gone_process_are_removed_and_nothing_else(tmp_path):
    dead = _dead_pid()
    stale = tmp_path / f"retrylab-run-{dead}-abc"
    (stale / "submission").mkdir(parents=True)
    (stale / "submission" / "worker.py").write_text("print('left behind')\n")
    os.chmod(stale / "submission", 0)        # as a learner's script may leave it
    live = tmp_path / f"retrylab-redis-{os.getpid()}-def"
    live.mkdir()
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    link = tmp_path / f"retrylab-run-{dead}-link"
    link.symlink_to(target)
    unrelated = tmp_path / "retrylab-notes"
    unrelated.mkdir()

    assert tempdirs.sweep_stale(str(tmp_path)) == 1
    assert not stale.exists()
    assert live.is_dir() and unrelated.is_dir()
    assert link.is_symlink() and (target / "keep.txt").read_text() == "x"


def test_a_grading_sweeps_at_its_start(tmp_path):
    stale = tmp_path / f"retrylab-run-{_dead_pid()}-xyz"
    stale.mkdir()
    made = tempdirs.make("run")
    try:
        assert made.name.startswith(f"retrylab-run-{os.getpid()}-") and oct(made.stat().st_mode)[-3:] == "700"
    finally:
        tempdirs.remove_tree(made)
    from retrylab.fixtures.backoff_dlq import corpus
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "retrylab", "check", str(corpus.REFERENCE), "--step", "3"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not stale.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("retrylab-")], list(tmp_path.iterdir())


def test_an_interrupt_during_a_removal_is_held_until_the_folder_is_gone(tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM, raised as one) landing in the middle of a removal: the folder still goes, then the
    interrupt goes on."""
    folder = tmp_path / f"retrylab-run-{os.getpid()}-abc"
    (folder / "submission").mkdir(parents=True)
    (folder / "submission" / "worker.py").write_text("print('x')\n")
    real, calls = tempdirs.shutil.rmtree, []

    def interrupted_once(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)
    monkeypatch.setattr(tempdirs.shutil, "rmtree", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        tempdirs.remove_tree(folder)
    assert not folder.exists() and len(calls) == 2
