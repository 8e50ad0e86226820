"""Learner scripts run contained: time limit, bounded output, allowlisted environment, a copy."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from retrylab.sandbox import CappedBuffer, Limits, Sandbox


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        h.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def _submission(tmp_path: Path, **scripts: str) -> Path:
    folder = tmp_path / "submission"
    folder.mkdir()
    for name, code in scripts.items():
        (folder / f"{name}.py").write_text(code)
    return folder


def test_a_script_that_hangs_is_stopped_at_its_time_limit(tmp_path):
    folder = _submission(tmp_path, hang="import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: pass\n")
    with Sandbox(folder) as box:
        result = box.run("hang.py", env={}, timeout=1.0)
    assert result.stopped == "timeout" and result.returncode is None
    assert "had not finished" in result.describe() and "harness stopped it" in result.describe()


def test_output_is_bounded_and_says_how_much_was_dropped(tmp_path):
    folder = _submission(tmp_path, noisy="import sys\nfor i in range(200000): print('line', i)\n")
    with Sandbox(folder, Limits(output_bytes=4096)) as box:
        result = box.run("noisy.py", env={}, timeout=30)
    assert result.returncode == 0
    assert result.stdout.startswith("line 0\n") and "line 199999" in result.stdout
    assert "bytes not shown" in result.stdout and len(result.stdout) < 4096 + 200


def test_capped_buffer_keeps_head_and_tail():
    buffer = CappedBuffer(10)
    for chunk in (b"abc", b"defgh", b"ijklmnop"):
        buffer.feed(chunk)
    assert buffer.text().startswith("abcde") and buffer.text().endswith("lmnop")
    assert buffer.dropped == 6


def test_environment_is_an_allowlist(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "secret-token-value")
    folder = _submission(tmp_path, env="import os\nprint(sorted(os.environ))\nprint(os.environ.get('GITHUB_TOKEN'))\n")
    with Sandbox(folder) as box:
        result = box.run("env.py", env={"REDIS_URL": "redis://x"}, timeout=20)
    assert "secret-token-value" not in result.stdout and "GITHUB_TOKEN" not in result.stdout
    assert "REDIS_URL" in result.stdout and "'TZ'" in result.stdout


def test_the_submission_is_unchanged_and_the_copy_removed(tmp_path):
    folder = _submission(tmp_path, scribble="import os, shutil\nopen('new.txt','w').write('x')\nos.remove('scribble.py')\n")
    before = _digest(folder)
    with Sandbox(folder) as box:
        result = box.run("scribble.py", env={}, timeout=20)
        workdir = box.workdir
    assert result.returncode == 0, result.stderr
    assert _digest(folder) == before
    assert not workdir.exists()


def test_memory_limit_stops_a_runaway_allocation(tmp_path):
    folder = _submission(tmp_path, hog="x = []\nwhile True: x.append(bytearray(50 << 20))\n")
    with Sandbox(folder, Limits(memory_bytes=512 << 20)) as box:
        result = box.run("hog.py", env={}, timeout=30)
    assert result.crashed and "MemoryError" in result.stderr


def test_processes_left_behind_in_the_group_are_killed(tmp_path):
    # the pid comes back on stdout: as root the script runs as another uid, which cannot write here
    # (in a PID namespace of its own that pid is not the host's: a marker in its command line finds it)
    marker = f"left-behind-{os.getpid()}-{time.monotonic_ns()}"
    folder = _submission(tmp_path, forker=f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)  # {marker}'])\nprint(p.pid)\n")
    with Sandbox(folder) as box:
        result = box.run("forker.py", env={}, timeout=20)
    assert result.returncode == 0, result.stderr
    pid = int(result.stdout)
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert state == "Z" or marker.encode() not in cmdline, "the child outlived grading"
    except (ProcessLookupError, FileNotFoundError):
        pass
    for other in os.listdir("/proc"):
        try:
            if marker.encode() in Path(f"/proc/{other}/cmdline").read_bytes():
                assert Path(f"/proc/{other}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", \
                    "the child outlived grading"
        except OSError:
            continue


def test_kill_ends_a_run_at_once_as_killed_and_its_sigterm_handler_never_runs(tmp_path):
    """Sandbox.kill is a crash: SIGKILL to every process of the run, whatever it does on SIGTERM. The threads
    it had are what learner_threads counted while it ran."""
    # untimed waits: a learner's timed sleeps are the virtual clock's, and return at once
    code = ("import signal, sys, threading\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('graceful', flush=True), sys.exit(0)))\n"
            "for _ in range(4):\n    threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
            "print('ready', flush=True)\nthreading.Event().wait()\n")
    folder = _submission(tmp_path, worker=code)
    seen: list[int] = []
    with Sandbox(folder) as box:
        def stop_when() -> bool:
            seen.append(box.learner_threads())
            if max(seen) >= 5:      # the main thread and its four
                box.kill()
            return False
        result = box.run("worker.py", env={}, timeout=30, stop_when=stop_when)
        assert box.learner_threads() == 0   # between runs
    assert result.stopped is None and result.returncode == -9, result
    assert "graceful" not in result.stdout and result.seconds < 25
    assert 5 <= max(seen) <= 8      # the script's threads, and a namespace's helper processes where there are some
