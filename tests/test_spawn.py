"""Private servers die with the grading's spawning thread, and no Python code runs in a server's child between fork
and exec: in CPython before 3.12 that code can wait for ever on a lock another thread held at the fork (gh-112275;
a CI run hung starting a Tansu broker)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from retrylab import spawn

from helpers import alive, wait_until

needs_setpriv = pytest.mark.skipif(spawn._setpriv() is None, reason="util-linux's setpriv is not installed here")


@needs_setpriv
def test_a_server_is_started_without_python_code_in_its_child(monkeypatch):
    seen = {}
    real = subprocess.Popen

    def recording(argv, **kwargs):
        seen.update(kwargs, argv=argv)
        return real(argv, **kwargs)

    monkeypatch.setattr(spawn.subprocess, "Popen", recording)
    proc = spawn.spawn_server([sys.executable, "-c", "pass"])
    assert proc.wait(timeout=30) == 0
    assert seen.get("preexec_fn") is None
    assert seen["argv"][:4] == [spawn._setpriv()[0], "--pdeathsig", "KILL", "--no-new-privs"]


@needs_setpriv
def test_a_server_whose_grading_is_gone_before_it_is_bound_to_it_stops():
    # the pid it is told is not its parent's: the grading died between the fork and setpriv
    argv = spawn._with_parent_death_signal(["/bin/sh", "-c", "echo ran"], parent=1)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and done.stdout == ""


@needs_setpriv
def test_a_server_gets_no_new_privileges_and_keeps_its_pid_through_the_wrappers():
    proc = spawn.spawn_server(["/bin/sh", "-c", "grep NoNewPrivs /proc/self/status; echo $$"], stdout=subprocess.PIPE,
                              text=True)
    out, _ = proc.communicate(timeout=30)
    assert "NoNewPrivs:\t1" in out
    assert out.split()[-1] == str(proc.pid)


def test_a_server_dies_when_the_thread_that_spawned_it_ends():
    # a grading process that spawns a server and is then killed outright (no code of its own runs)
    code = textwrap.dedent("""
        import os, signal, subprocess
        from retrylab.spawn import spawn_server
        proc = spawn_server(["sleep", "300"], stdout=subprocess.DEVNULL)
        print(proc.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    grading = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    server = int(grading.stdout.split()[0])
    wait_until(lambda: not alive(server), "the server to end with its grading", timeout=10)


def test_a_look_for_setpriv_that_failed_for_a_transient_reason_is_not_kept(monkeypatch):
    """Kept, it would send every later server of the process (and of the gradings a warm process forks) to the
    preexec_fn fallback."""
    monkeypatch.setattr(spawn, "_setpriv_found", [])
    monkeypatch.setattr(spawn.shutil, "which", lambda name: "/usr/bin/setpriv")

    def out_of_processes(*args, **kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(spawn.subprocess, "run", out_of_processes)
    assert spawn._setpriv() is None
    assert spawn._setpriv_found == []                       # looked for again next time
    monkeypatch.setattr(spawn.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=" --pdeathsig <sig>\n"))
    assert spawn._setpriv() == ("/usr/bin/setpriv", "/bin/sh")
    monkeypatch.setattr(spawn.subprocess, "run", out_of_processes)
    assert spawn._setpriv() == ("/usr/bin/setpriv", "/bin/sh")   # a lasting answer is kept
