"""grade-batch's warm grading processes (retrylab.gradeworker): each submission is still graded in a
process of its own, in a group of its own, with the same rows as a cold grading; a warm process that
cannot warm up leaves the batch cold, one that has forked its share is replaced, and one that dies under
a grading gives that submission an error row and takes the grading's processes with it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import alive
from retrylab import batch, gradeworker, procfs
from retrylab.fixtures.backoff_dlq import corpus

ENTRIES = {e.id: e for e in corpus.entries()}
MIX = ["correct/envelope-format", "wrong/schedule-short", "wrong/worker-drops-failed", "wrong/empty-directory"]
# what a row says of a grade (seconds differ from run to run)
GRADE = ("status", "score", "reason")


def _materialize(root: Path, ids: list[str]) -> list[batch.Submission]:
    for entry_id in ids:
        ENTRIES[entry_id].materialize(root / ENTRIES[entry_id].name)
    return batch.discover(root)


def _pgid(pid: int) -> int | None:
    fields = procfs.stat_fields(pid)
    return int(fields[2]) if fields else None


def test_warm_and_cold_batches_give_the_same_rows(tmp_path):
    submissions = _materialize(tmp_path / "submissions", MIX)
    rows = {}
    for warm in (True, False):
        config = batch.BatchConfig(jobs=2, warm=warm)
        summary = batch.run_batch(submissions, config, tmp_path / f"gradebook-{warm}.json")
        rows[warm] = {r["id"]: ({k: r[k] for k in GRADE}, {k: v for k, v in r.items() if k.startswith("step")})
                      for r in summary.rows}
    assert rows[True] == rows[False]
    assert rows[True]["envelope-format"][0]["status"] == "pass"
    assert {rows[True][n][0]["status"] for n in ("schedule-short", "worker-drops-failed", "empty-directory")} == {"fail"}


def test_a_forked_grading_has_a_group_of_its_own_and_its_report(tmp_path):
    (submission,) = _materialize(tmp_path / "submissions", ["correct/envelope-format"])
    worker = gradeworker.WarmWorker(batch.BatchConfig().exercise_id, "fake", start_limit=120)
    try:
        result = tmp_path / "report.json"
        grading = worker.start([str(submission.path), str(result), "--backend", "fake"], str(tmp_path / "err"), 60)
        assert grading.pid != worker._proc.pid
        groups = set()
        while alive(grading.pid) and grading.pid not in groups:   # it calls setsid as it starts
            groups.add(_pgid(grading.pid))
        assert grading.wait(timeout=120) == 0, (tmp_path / "err").read_text()
        assert grading.pid in groups
        assert batch.row_from_report(submission, json.loads(result.read_text()), 0.0,
                                     batch.BatchConfig())["status"] == "pass"
    finally:
        worker.close()
    assert worker._proc.returncode == 0    # closing its stdin ends it


def test_a_warm_process_that_cannot_warm_up_leaves_the_thread_cold():
    pool = gradeworker.WarmPool("no-such-exercise", "fake", start_limit=120)
    try:
        assert pool.worker() is None
        assert pool.worker() is None
        assert pool._all == []
    finally:
        pool.close()


def test_a_warm_process_left_with_a_thread_it_cannot_see_does_not_fork():
    """A thread a C library started while warming up (a Kafka client's, say) is not in threading's count, and a
    fork would copy the locks it holds: the warm process says no "ready", and the batch grades cold."""
    script = ("import _thread, os, time\n"
              "from retrylab import gradeworker\n"
              "hold = _thread.allocate_lock(); hold.acquire()\n"
              "def warm_up(*_):\n"
              "    _thread.start_new_thread(hold.acquire, ())\n"
              "    while len(os.listdir('/proc/self/task')) < 2: time.sleep(0.01)\n"
              "gradeworker._warm_up = warm_up\n"
              "raise SystemExit(gradeworker.main(['backoff-dlq', 'fake']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and "ready" not in done.stdout, (done.stdout, done.stderr)


def test_a_warm_process_that_has_forked_its_share_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(gradeworker, "WARM_GRADINGS", 1)
    (submission,) = _materialize(tmp_path / "submissions", ["wrong/empty-directory"])
    pool = gradeworker.WarmPool(batch.BatchConfig().exercise_id, "fake", start_limit=120)
    try:
        first = pool.worker()
        grading = first.start([str(submission.path), str(tmp_path / "r.json")], str(tmp_path / "err"), 60)
        grading.wait(timeout=120)
        second = pool.worker()
        assert second is not None and second is not first
        assert first._proc.returncode is not None   # closed when it was replaced
    finally:
        pool.close()


def test_a_warm_process_dying_under_a_grading_gives_an_error_row_and_stops_the_grading(tmp_path):
    (submission,) = _materialize(tmp_path / "submissions", ["correct/envelope-format"])
    (submission.path / "worker.py").write_text("import time\nwhile True:\n    time.sleep(0.1)\n")
    pool = gradeworker.WarmPool(batch.BatchConfig().exercise_id, "fake", start_limit=120)
    worker = pool.worker()
    started = []
    original = worker.start

    def start_then_kill_the_warm_process(*args):
        grading = original(*args)
        started.append(grading.pid)
        os.kill(worker._proc.pid, signal.SIGKILL)
        return grading

    worker.start = start_then_kill_the_warm_process
    (tmp_path / "work").mkdir()
    try:
        row = batch.grade_in_subprocess(submission, batch.BatchConfig(timeout=120), tmp_path / "work", warm=pool)
    finally:
        pool.close()
    assert row["status"] == "error"
    assert row["reason"] == "the grading process was killed by SIGKILL without a report"
    for _ in range(50):                  # the killed grading is reaped by init a moment later
        if not alive(started[0]):
            break
        time.sleep(0.1)
    assert not alive(started[0])
    assert worker.worn     # the thread's next grading gets a new warm process


@pytest.mark.parametrize("backend, forks_servers", [("fake", True), ("redis-server", False)])
def test_warming_up_imports_the_checks_and_the_brokers_client_once_for_every_fork(backend, forks_servers):
    """The fake server's modules too, for the backend whose servers the gradings fork; for another, what spawning
    its servers looks for. The message catalogs are read too, in the batch's language and English."""
    script = (f"import sys; from pathlib import Path; from retrylab import gradeworker, i18n, spawn; "
              f"gradeworker._warm_up('backoff-dlq', {backend!r}, 'ru'); "
              "print('redis' in sys.modules, 'checks.backoff_dlq.test_step1_worker' in sys.modules, "
              "'fakeredis' in sys.modules, bool(spawn._setpriv_found)); "
              "from retrylab.checks.backoff_dlq import catalog; from retrylab import exercise; "
              "made = [i18n.engine(), i18n.exercise_catalog(exercise.get('backoff-dlq')), "
              "i18n.catalog(Path(catalog.__file__).resolve().parent / 'locales')]; "
              "print(*(sorted(c.messages) for c in made), sep='|')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    # where the gradings spawn their servers, setpriv has been looked for once, before any fork
    assert lines[0].split() == ["True", "True", str(forks_servers), str(not forks_servers)], done.stderr
    assert lines[1] == "|".join([str(["en", "ru"])] * 3), done.stderr


def test_a_forked_grading_grows_its_descriptor_table_before_it_has_threads_and_keeps_no_descriptor():
    """Outgrowing the table later, with threads, costs the thread that opens a descriptor an RCU grace period."""
    script = ("import os\n"
              "def table():\n"
              "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('FDSize'))\n"
              "from retrylab import gradeworker\n"
              "before, fds = table(), sorted(os.listdir('/proc/self/fd'))\n"
              "gradeworker._room_for_descriptors()\n"
              "print(before, table(), sorted(os.listdir('/proc/self/fd')) == fds)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    before, after, same = done.stdout.split()
    assert int(before) < gradeworker.ROOM_FOR_DESCRIPTORS <= int(after), done.stderr
    assert same == "True"
