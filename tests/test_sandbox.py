"""Learner scripts run contained: time limit, bounded output, allowlisted environment, a copy."""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from retrylab import runcopy, runfs, sandbox, tempdirs
from retrylab.sandbox import CappedBuffer, Limits, Sandbox
from retrylab.verdict import CheckFailed


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


def test_the_environment_is_copied_whole_while_another_thread_changes_it(monkeypatch):
    # pytest sets and removes PYTEST_CURRENT_TEST around every phase of every check, while the runs beside the
    # steps start learner processes: copying os.environ then raised KeyError in the run's thread
    monkeypatch.setenv("LANG", "C.UTF-8")
    stop, failures = threading.Event(), []

    def churn():
        while not stop.is_set():
            os.environ["RETRYLAB_TEST_CHURN"] = "1"
            os.environ.pop("RETRYLAB_TEST_CHURN", None)

    changer = threading.Thread(target=churn, daemon=True)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)          # switch threads as often as the interpreter can
    changer.start()
    try:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            try:
                assert Sandbox.template_environment()["LANG"] == "C.UTF-8"
            except (KeyError, RuntimeError) as exc:
                failures.append(repr(exc))
                break
    finally:
        stop.set()
        changer.join()
        sys.setswitchinterval(previous)
    assert not failures, failures


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


def test_the_memory_limit_counts_data_written_not_address_space_reserved(tmp_path):
    # 40 threads that each malloc: glibc reserves a 64 MB arena per thread (at least 8 of them) and 8 MB of stack,
    # so the address space passes 512 MiB while the data written (the stacks, counted whole) stays under it. A
    # limit on address space refused a thread ("can't start new thread"), and the learner was told of a limit of
    # 64 processes: a Kafka client's process got about 16 threads under 1 GiB, at 50 MB resident
    folder = _submission(tmp_path, threads="""
import threading
ready = threading.Barrier(41)
def work():
    junk = [bytes(100) for _ in range(1000)]
    ready.wait()
for _ in range(40):
    threading.Thread(target=work).start()
ready.wait()
print(int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) << 10)
""")
    with Sandbox(folder, Limits(memory_bytes=512 << 20)) as box:
        result = box.run("threads.py", env={}, timeout=30)
    assert result.returncode == 0, result.describe() + result.stderr
    assert int(result.stdout) > 512 << 20       # the case this test is about


def test_a_shared_mapping_is_bounded_by_the_address_space_limit(tmp_path):
    # RLIMIT_DATA counts private mappings only: a shared one (mmap of -1) is left to the looser address space limit
    limits = Limits(memory_bytes=256 << 20, processes=8)
    folder = _submission(tmp_path, shared=f"import mmap\nmmap.mmap(-1, {limits.address_space_bytes})\n",
                         fits="import mmap\nm = mmap.mmap(-1, 512 << 20)\nm[-1] = 1\n")
    with Sandbox(folder, limits) as box:
        refused = box.run("shared.py", env={}, timeout=20)
        fits = box.run("fits.py", env={}, timeout=20)
    assert refused.limit == "the 256 MiB memory limit", refused.describe() + refused.stderr
    assert fits.returncode == 0, fits.describe() + fits.stderr     # shared, so not counted as data


# each holds 64 MB pieces, every page written, then blocks for ever (a sleep is virtual in a learner run) or ends;
# no rlimit sees the run's total: they bound one process each, and memfd files and shared mappings escape them
HOARDS = {
    "memfd": """import os, sys
held = []
for i in range(int(sys.argv[1])):          # files, never mapped: RLIMIT_AS does not see them
    held.append(os.memfd_create(f"hoard{i}"))
    for _ in range(8):
        os.write(held[-1], bytes(8 << 20))
""",
    "forked": """import os, sys
for i in range(int(sys.argv[1]) - 1):      # one piece per process: each process is far under the limit
    if os.fork() == 0:
        break
held = bytearray(b"x" * (64 << 20))
""",
    "shared-mapping": """import mmap, sys
held = mmap.mmap(-1, int(sys.argv[1]) << 26)   # shared: RLIMIT_DATA does not count it
for at in range(0, len(held), 4096):
    held[at] = 1
""",
}
BLOCK = """if sys.argv[2] == "hold":
    os.read(os.pipe()[0], 1)
"""


@pytest.mark.parametrize("how", sorted(HOARDS))
def test_the_memory_a_run_holds_in_all_is_bounded_and_named(how, tmp_path):
    folder = _submission(tmp_path, hoard="import os\n" + HOARDS[how] + BLOCK)
    with Sandbox(folder, Limits(memory_bytes=256 << 20)) as box:
        started = time.monotonic()
        over = box.run("hoard.py", env={}, timeout=60, args=("6", "hold"))
        took = time.monotonic() - started
        under = box.run("hoard.py", env={}, timeout=60, args=("2", "end"))
    assert over.limit == "the 256 MiB memory limit", over.describe() + over.stderr
    assert took < 30                      # stopped when it was counted, not at the run's timeout
    assert under.returncode == 0 and under.limit is None, under.describe() + under.stderr


def test_pages_forked_processes_share_are_counted_once(tmp_path):
    # 20 processes sharing their parent's 48 MB (copy on write) hold 48 MB, not 20 times that
    folder = _submission(tmp_path, sharing="""import os, time
shared = bytearray(b"x" * (48 << 20))
children = []
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        os.read(os.pipe()[0], 1)           # held until killed
    children.append(pid)
while time.process_time() < 1.5:           # real CPU time (sleeps are virtual in a learner run): several counts
    pass
for pid in children:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
""")
    with Sandbox(folder, Limits(memory_bytes=256 << 20)) as box:
        result = box.run("sharing.py", env={}, timeout=60)
    assert result.returncode == 0 and result.limit is None, result.describe() + result.stderr


def test_a_blocking_io_error_is_not_called_the_process_limit(tmp_path):
    # EAGAIN of a non-blocking socket reads "Resource temporarily unavailable", as a refused fork does
    folder = _submission(tmp_path, nb="import socket\na, b = socket.socketpair()\na.setblocking(False)\na.recv(1)\n")
    with Sandbox(folder) as box:
        result = box.run("nb.py", env={}, timeout=20)
    assert result.returncode == 1 and "BlockingIOError" in result.stderr
    assert result.limit is None and "limit" not in result.describe()


SUBPROCESS_REFUSED = """Traceback (most recent call last):
  File "/sub/worker.py", line 3, in <module>
    subprocess.Popen(["sleep", "9"])
  File "/usr/lib/python3.11/subprocess.py", line 1901, in _execute_child
    self.pid = _fork_exec(
               ^^^^^^^^^^^
BlockingIOError: [Errno 11] Resource temporarily unavailable"""
FORK_REFUSED = """  File "/sub/worker.py", line 4, in <module>
    os.fork()
BlockingIOError: [Errno 11] Resource temporarily unavailable"""
LOCK_BUSY = """  File "/sub/worker.py", line 4, in <module>
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
BlockingIOError: [Errno 11] Resource temporarily unavailable"""


@pytest.mark.parametrize("tail, refused", [
    (SUBPROCESS_REFUSED, True), (FORK_REFUSED, True), ("bash: fork: retry: Resource temporarily unavailable", True),
    ("RuntimeError: can't start new thread", True), (LOCK_BUSY, False), ("", False),
], ids=["subprocess", "os.fork", "bash", "thread", "flock", "nothing"])
def test_only_a_refused_fork_or_thread_names_the_process_limit(tail, refused):
    assert sandbox._task_refused(tail) is refused


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


# -- what a run may write in all (retrylab.runfs) --------------------------------------------

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs for the run's folder needs root")

FILLS_ITS_FOLDER = """import os
home = os.environ["HOME"]
n = 0
while True:    # files under the per-file limit, one after another, in its copy and its home by turns
    with open(os.path.join("." if n % 2 else home, f"blob{n}"), "wb") as f:
        f.write(b"x" * (16 << 20))
    n += 1
"""


@as_root
def test_a_run_cannot_write_more_than_its_disk_limit_in_total(tmp_path):
    folder = _submission(tmp_path, fill=FILLS_ITS_FOLDER)
    free_before = shutil.disk_usage(tempfile.gettempdir()).free
    with Sandbox(folder, Limits(disk_bytes=96 << 20)) as box:
        result = box.run("fill.py", env={}, timeout=30)
        root = box.root
        assert box.disk_bounded
    assert result.returncode == 1 and "No space left on device" in result.stderr
    assert "the 96 MiB limit on all the files a run may write" in result.describe()
    assert not root.exists() and not os.path.ismount(root)
    # the machine's temporary folder never held it (a margin for what else writes there meanwhile)
    assert shutil.disk_usage(tempfile.gettempdir()).free > free_before - (64 << 20)


@as_root
def test_a_run_cannot_use_up_the_inodes(tmp_path):
    folder = _submission(tmp_path, many="n = 0\nwhile True:\n    open(f'f{n}', 'w').close()\n    n += 1\n")
    with Sandbox(folder, Limits(disk_files=2000)) as box:
        result = box.run("many.py", env={}, timeout=30)
    assert result.returncode == 1 and "No space left on device" in result.stderr
    assert "(2000 files at most)" in result.describe()


@as_root
def test_a_run_folder_left_mounted_by_a_killed_grading_is_swept(tmp_path):
    stale = tmp_path / "retrylab-run-999999999-x"     # no process has that pid
    stale.mkdir()
    assert runfs.mount_bounded(stale, 1 << 20, 100)
    (stale / "left.txt").write_text("by a run whose grading was killed")
    assert tempdirs.sweep_stale(str(tmp_path)) == 1
    assert not stale.exists() and not os.path.ismount(stale)


def test_where_the_harness_may_not_mount_the_run_folder_stays_where_it_was(tmp_path, monkeypatch):
    monkeypatch.setattr(runfs, "mount_bounded", lambda *args, **kwargs: False)
    folder = _submission(tmp_path, write="open('out.txt', 'w').write('x' * 1000)\n")
    with Sandbox(folder) as box:
        result = box.run("write.py", env={}, timeout=20)
        assert not box.disk_bounded and not os.path.ismount(box.root)
        root = box.root
    assert result.returncode == 0, result.stderr
    assert not root.exists()


@pytest.mark.skipif(not runfs.available(), reason="a run's folder is bounded only where the harness may mount")
def test_a_submission_too_large_for_the_runs_copy_is_the_learners_to_fix(tmp_path):
    folder = _submission(tmp_path, worker="print('hi')\n")
    with open(folder / "dump.bin", "wb") as f:
        f.truncate(Limits().disk_bytes + (64 << 20))       # sparse here, written whole into the copy
    with pytest.raises(CheckFailed) as failed:
        Sandbox(folder).__enter__()
    assert "does not fit" in failed.value.message and "dump.bin" in failed.value.message
    assert "512 MiB" in failed.value.message


@pytest.mark.parametrize("error, verdict", [(errno.EACCES, CheckFailed), (errno.EIO, sandbox.SandboxError)])
def test_a_file_the_harness_may_not_read_is_named_and_other_copy_errors_are_the_harnesss(tmp_path, monkeypatch,
                                                                                       error, verdict):
    # as root the harness reads every file; a grader without that right met a learner's mode-000 file as a
    # "harness defect" on every step
    folder = _submission(tmp_path, worker="print('hi')\n")
    (folder / "schedule.txt").write_text("1\n")
    copy = runcopy._copy_regular

    def refuse(src, dst):
        if src.endswith("schedule.txt"):
            raise OSError(error, os.strerror(error), src)
        copy(src, dst)

    monkeypatch.setattr(runcopy, "_copy_regular", refuse)
    with pytest.raises(verdict) as raised:
        Sandbox(folder).__enter__()
    if verdict is CheckFailed:
        assert "cannot read schedule.txt" in raised.value.message and "Permission denied" in raised.value.message
    else:
        assert "schedule.txt" in str(raised.value) and raised.value.errno == errno.EIO


@pytest.mark.parametrize("kind", ["folder", "pipe", "broken link"])
def test_a_script_that_is_there_but_not_a_file_is_named_as_such_not_missing(tmp_path, kind):
    from retrylab.fixtures.backoff_dlq.corpus import REFERENCE
    from retrylab.grading import grade
    mine = tmp_path / "mine"
    shutil.copytree(REFERENCE, mine)
    (mine / "worker.py").unlink()
    {"folder": lambda p: p.mkdir(), "pipe": os.mkfifo,
     "broken link": lambda p: p.symlink_to(tmp_path / "nowhere.py")}[kind](mine / "worker.py")
    step1 = next(r for r in grade(mine, steps=(1,)).results if r.number == 1)
    assert step1.status == "fail" and "worker.py in your submission is not a regular file" in step1.message, step1
