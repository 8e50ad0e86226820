"""Stop conditions (retrylab.settle): they combine like tenacity's stop_*, they read what the learner
is doing (the relay, CPU time from /proc), and a learner that gets no CPU for seconds is never taken
for one that has settled."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

import pytest

from retrylab.background import without_step_clock
from retrylab.brokers.redis.backends import make_backend
from retrylab.brokers.redis.commands import Command, read_timeout
from retrylab.runner import LearnerRunner
from retrylab.procfs import descendants
from retrylab.settle import Reason, Stop, StopCondition, blocked, no_progress, when


def _command(*args: str) -> Command:
    return Command(seq=1, conn=1, at=0.0, args=tuple(a.encode() for a in args), truncated=False)


class _Says(StopCondition):
    def __init__(self, stop: Stop | None):
        self.stop, self.asked = stop, 0

    def check(self, progress):
        self.asked += 1
        return self.stop


def test_or_gives_the_first_answer_and_and_the_last_members_reason():
    a, b = Stop(Reason.NO_PROGRESS, "2.0"), Stop(Reason.BLOCKED_DONE)
    assert (_Says(None) | _Says(a) | _Says(b)).check(None) == a
    assert (_Says(a) & _Says(b)).check(None) == Stop(Reason.BLOCKED_DONE, "2.0")
    later = _Says(b)
    assert (_Says(None) & later).check(None) is None
    assert later.asked == 0  # an & stops asking at the first member that does not answer
    assert not (_Says(None) | _Says(None))(None)


@pytest.mark.parametrize("args, seconds", [
    (("BLPOP", "q", "0"), 0.0), (("BRPOP", "a", "b", "2.5"), 2.5), (("BRPOPLPUSH", "a", "b", "0"), 0.0),
    (("BLMOVE", "a", "b", "LEFT", "RIGHT", "3"), 3.0), (("BZPOPMIN", "z", "1"), 1.0),
    (("BLMPOP", "0", "1", "q", "LEFT"), 0.0), (("XREAD", "BLOCK", "1500", "STREAMS", "s", "$"), 1.5),
    (("XREAD", "STREAMS", "s", "0"), None), (("GET", "q"), None), (("BLPOP", "q", "soon"), None),
])
def test_read_timeout_knows_each_blocking_read(args, seconds):
    assert read_timeout(_command(*args)) == seconds


class _Progress:
    def __init__(self, *, started=True, cpu=0.0, since_change=0.0, reads=()):
        self._started, self._cpu, self._since, self._reads = started, cpu, since_change, list(reads)

    def started(self):
        return self._started

    def cpu(self):
        return self._cpu

    def cpu_since_change(self):
        return self._since

    def blocked_reads(self):
        return self._reads


def test_no_progress_counts_cpu_from_the_first_broker_command_not_from_process_start():
    stuck = no_progress(cpu=2.0, startup=3.0)
    assert stuck.check(_Progress(started=False, cpu=2.5)) is None  # an interpreter starting: not stuck
    assert stuck.check(_Progress(started=False, cpu=3.0)).reason is Reason.SPIN_NO_IO
    assert stuck.check(_Progress(cpu=9.0, since_change=1.9)) is None
    assert stuck.check(_Progress(cpu=9.0, since_change=2.0)).reason is Reason.NO_PROGRESS


def test_blocked_forever_needs_a_read_without_timeout():
    timed = _Progress(reads=[_command("BLPOP", "q", "1")])
    endless = _Progress(reads=[_command("BLPOP", "q", "0")])
    assert blocked(forever=True).check(timed) is None
    assert blocked(forever=True).check(endless) == Stop(Reason.BLOCKED_FOREVER, "BLPOP q 0")
    assert blocked().check(timed).reason is Reason.BLOCKED_DONE
    assert blocked().check(_Progress()) is None


# -- real runs ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fake_backend():
    backend = make_backend("fake")
    backend.start()
    yield backend
    backend.stop()


def _run(tmp_path, source: str, backend, stop_when, timeout=20.0, seed=()):
    folder = tmp_path / "submission"
    folder.mkdir(exist_ok=True)
    (folder / "worker.py").write_text(source)
    with backend.private() as endpoint, endpoint.client() as client:
        if seed:
            client.rpush("q", *seed)
        run = LearnerRunner(folder).run("worker.py", endpoint, timeout=timeout, stop_when=stop_when)
        return run, client.lrange("done", 0, -1)


WAITS_FOREVER = "import redis\nr = redis.Redis()\nr.rpush('done', 'x')\nr.blpop('nothing', 0)\n"


def test_a_run_waiting_forever_stops_at_once_and_says_why(tmp_path, fake_backend):
    started = time.monotonic()
    run, _ = _run(tmp_path, WAITS_FOREVER, fake_backend, blocked(forever=True) | no_progress(cpu=2.0))
    assert run.result.reason == Reason.BLOCKED_FOREVER.value
    assert time.monotonic() - started < 10
    assert "without a timeout (BLPOP nothing 0)" in run.result.describe()


def test_a_script_spinning_without_io_is_stopped_for_its_cpu_time(tmp_path, fake_backend):
    run, _ = _run(tmp_path, "while True:\n    pass\n", fake_backend, no_progress(cpu=2.0, startup=1.0), timeout=60)
    assert run.result.reason == Reason.SPIN_NO_IO.value
    assert run.result.cpu >= 1.0
    assert "without sending a single Redis command" in run.result.describe()


DRAINS = """import os, signal, redis
r = redis.Redis()
r.ping()
os.kill(os.getpid(), signal.SIGSTOP)   # a busy machine: no CPU for a while, right after starting
while (item := r.lpop('q')) is not None:
    r.rpush('done', item)
"""


def test_a_learner_without_cpu_for_seconds_is_not_taken_for_settled(tmp_path, fake_backend):
    """What a loaded machine did to correct workers (issue 10), made certain: the learner gets no
    CPU for 3 s after its first command. No condition may stop it meanwhile."""
    frozen_at = []

    def wake(progress) -> bool:  # never stops the run: lets the stopped learner go on after 3 s
        supervisor = progress.sandbox._supervisor
        if supervisor and progress.started():
            frozen_at.append(frozen_at[0] if frozen_at else time.monotonic())
            if time.monotonic() - frozen_at[0] > 3.0:
                for pid in descendants(supervisor):
                    with contextlib.suppress(ProcessLookupError):   # one of the sandbox's own helpers may have ended
                        os.kill(pid, signal.SIGCONT)
        return False

    everything = (blocked(forever=True) | no_progress(cpu=0.3) | (blocked() & when(lambda p: True, Reason.BLOCKED_DONE))
                  | when(wake, Reason.CAP))
    messages = [json.dumps({"n": n}).encode() for n in range(5)]
    run, done = _run(tmp_path, DRAINS, fake_backend, everything, seed=messages)
    assert run.result.reason == Reason.EXITED.value, run.result.describe()
    assert done == messages
    assert run.result.seconds > 3.0


def test_the_runner_keeps_every_runs_timing_with_the_thread_that_ran_it(tmp_path, fake_backend):
    """What bench/grade_bench.py reads to say where a grading's time goes: the runs of a step (the main thread)
    and those beside the steps (a copy without the step clock, in a thread of its own) in one record."""
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "once.py").write_text("import redis\nredis.Redis().set('k', 'v')\n")
    runner = LearnerRunner(folder)
    beside = without_step_clock(runner)
    with fake_backend.private() as endpoint:
        runner.run("once.py", endpoint, timeout=20)
        thread = threading.Thread(target=beside.run, args=("once.py", endpoint), kwargs={"timeout": 20},
                                  name="retrylab-beside")
        thread.start()
        thread.join()
        runner.run("missing.py", endpoint, timeout=20)    # no script, no run: nothing to time
    assert [(t.script, t.thread) for t in runner.timings] == [("once.py", "MainThread"), ("once.py", "retrylab-beside")]
    assert all(t.first_command is not None and t.run >= t.first_command for t in runner.timings)
