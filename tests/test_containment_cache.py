"""The containment measurement is kept across `retrylab check` runs (retrylab.containment_cache): a
second grading does not measure again, and a cached answer is believed only when it is this user's,
writable by no one else, recent, whole, and about the machine as it is now."""
from __future__ import annotations

import errno
import os
import time

import pytest

from retrylab import containment, containment_cache, sandbox
from retrylab.containment import NAMESPACES_VARIABLE, Containment, TransientProblem

MEASURED = Containment(unprivileged_uid=True, cgroups=("/sys/fs/cgroup/x",), notes=("a note",),
                       namespaces="bwrap", bwrap="/usr/bin/bwrap")


class Measure:
    def __init__(self, result: Containment = MEASURED):
        self.calls = 0
        self.result = result

    def __call__(self) -> Containment:
        self.calls += 1
        return self.result


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(containment_cache.CACHE_VARIABLE, raising=False)
    return tmp_path / "cache" / "retrylab"


def _only_file(folder):
    (path,) = folder.glob("containment-*.json")
    return path


def test_a_second_grading_reads_the_measurement_instead_of_measuring(cache_home):
    measure = Measure()
    assert containment_cache.cached(("redis",), measure) == MEASURED
    assert containment_cache.cached(("redis",), measure) == MEASURED
    assert measure.calls == 1
    assert oct(cache_home.stat().st_mode & 0o777) == oct(0o700)


def test_another_machine_state_is_another_measurement(monkeypatch):
    measure = Measure()
    containment_cache.cached(("redis",), measure)
    containment_cache.cached(("nats",), measure)                 # other client libraries
    monkeypatch.setenv(NAMESPACES_VARIABLE, "unshare")
    containment_cache.cached(("redis",), measure)                # another way asked for
    assert measure.calls == 3
    assert len({containment_cache.key(("redis",)), containment_cache.key(("nats",))}) == 2


def test_an_edited_harness_module_that_runs_learner_code_is_measured_again(monkeypatch, tmp_path):
    """A working copy of the harness keeps its version while its code changes: an answer measured by a broken
    edit (an unprivileged uid that 'does not work here') must not outlive the fix."""
    for name in containment_cache._MEASURING_CODE:
        (tmp_path / name).write_text("# the harness's module\n")
    monkeypatch.setattr(containment_cache, "_HERE", tmp_path)
    before = containment_cache.key(("redis",))
    (tmp_path / "confine.py").write_text("# the harness's module, edited\n")
    assert containment_cache.key(("redis",)) != before


def test_no_cache_when_turned_off(monkeypatch, cache_home):
    monkeypatch.setenv(containment_cache.CACHE_VARIABLE, "0")
    measure = Measure()
    containment_cache.cached(("redis",), measure)
    containment_cache.cached(("redis",), measure)
    assert measure.calls == 2 and not cache_home.exists()


def test_an_old_measurement_is_measured_again(cache_home):
    measure = Measure()
    containment_cache.cached(("redis",), measure)
    old = time.time() - containment_cache.CACHE_SECONDS - 1
    os.utime(_only_file(cache_home), (old, old))
    containment_cache.cached(("redis",), measure)
    assert measure.calls == 2


@pytest.mark.parametrize("garbage", [b"", b"not json", b"[]", b'{"unprivileged_uid": true}', b"\xff\xfe"])
def test_garbage_in_the_cache_is_measured_again(cache_home, garbage):
    measure = Measure()
    containment_cache.cached(("redis",), measure)
    _only_file(cache_home).write_bytes(garbage)
    assert containment_cache.cached(("redis",), measure) == MEASURED
    assert measure.calls == 2
    assert containment_cache.cached(("redis",), measure) == MEASURED and measure.calls == 2   # rewritten


def test_a_cache_others_may_write_is_not_believed(cache_home):
    measure = Measure()
    containment_cache.cached(("redis",), measure)
    path = _only_file(cache_home)
    path.chmod(0o666)                                            # anyone may have written it
    containment_cache.cached(("redis",), measure)
    assert measure.calls == 2
    cache_home.chmod(0o777)                                      # anyone may have replaced it
    containment_cache.cached(("redis",), measure)
    containment_cache.cached(("redis",), measure)
    assert measure.calls == 4                                    # and nothing is written there


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_cache_file_of_another_user_is_not_believed(cache_home):
    measure = Measure()
    containment_cache.cached(("redis",), measure)
    os.chown(_only_file(cache_home), 12345, 12345)
    containment_cache.cached(("redis",), measure)
    assert measure.calls == 2


def test_a_symlink_in_place_of_the_cache_file_is_not_followed(cache_home, tmp_path):
    measure = Measure()
    containment_cache.cached(("redis",), measure)
    path = _only_file(cache_home)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(elsewhere)
    containment_cache.cached(("redis",), measure)
    assert measure.calls == 2


def test_an_unwritable_cache_folder_leaves_the_grading_measuring(cache_home):
    cache_home.parent.mkdir()
    cache_home.write_text("a file where the folder should be")
    measure = Measure()
    assert containment_cache.cached(("redis",), measure) == MEASURED
    assert containment_cache.cached(("redis",), measure) == MEASURED
    assert measure.calls == 2


# -- a measurement from a busy moment (a probe that ran out of time) is not cached ----------------------------------

def test_a_measurement_weakened_for_a_transient_reason_is_not_cached(cache_home):
    measure = Measure(Containment(notes=("namespaces through bwrap do not work here (timed out)",), transient=True))
    assert containment_cache.cached(("redis",), measure).transient
    assert containment_cache.cached(("redis",), measure).transient
    assert measure.calls == 2                       # measured again: nothing was kept
    assert not list(cache_home.glob("containment-*.json"))


@pytest.mark.parametrize("why, transient", [(TransientProblem("ran out of time"), True), ("Permission denied", False)])
def test_detect_says_when_a_stronger_way_failed_for_a_transient_reason(why, transient, monkeypatch):
    monkeypatch.setenv(NAMESPACES_VARIABLE, "unshare")
    found = containment.detect(lambda candidate: why if candidate.namespaces else "")
    assert found.namespaces == "" and found.transient is transient
    assert any("do not work here" in note for note in found.notes)
    clean = containment.detect(lambda candidate: "")
    assert clean.namespaces == "unshare" and not clean.transient


class _Box:
    """A Sandbox whose probe run ends as `result` says."""

    result = None

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, *args, **kwargs):
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


def _ended(**how):
    return sandbox.ScriptResult(**{"script": "probe.py", "stdout": "", "stderr": "", "seconds": 30.0, **how})


@pytest.mark.parametrize("result, transient", [
    (_ended(returncode=None, stopped="timeout"), True),
    (_ended(returncode=-9, stopped=None), True),
    (OSError(errno.EAGAIN, "Resource temporarily unavailable"), True),
    (_ended(returncode=1, stopped=None, stderr="ModuleNotFoundError: No module named 'redis'\n"), False),
    (OSError(errno.EPERM, "Operation not permitted"), False),
    # reported by the run's init or supervisor, whose errors reach the harness as text
    (sandbox.SandboxError("could not run probe.py: BlockingIOError: [Errno 11] Resource temporarily unavailable"),
     True),
    (sandbox.SandboxError("could not run probe.py: supervisor: PermissionError: [Errno 1] Operation not permitted"),
     False),
])
def test_the_probe_says_which_failures_are_transient(result, transient, monkeypatch):
    monkeypatch.setattr(_Box, "result", result)
    monkeypatch.setattr(sandbox, "Sandbox", _Box)
    why = sandbox._probe(Containment(), ("redis",))
    assert why and isinstance(why, TransientProblem) is transient, why


def test_a_transient_measurement_serves_only_its_own_process_and_only_a_while(monkeypatch):
    """Every run of a grading asks: within the process that measured, a minute at most (a probe that timed out is
    not waited for at every run); a grading forked from it (grade-batch's warm process) measures for itself."""
    monkeypatch.setattr(sandbox, "_detected", {})
    monkeypatch.setattr(sandbox, "_transient", {})
    monkeypatch.setenv(NAMESPACES_VARIABLE, "unshare")
    answers = [TransientProblem("probe.py did not finish within 30 s")] * 2
    probes = []

    def probe(candidate, learner_imports):
        probes.append(candidate)
        return answers.pop(0) if candidate.namespaces and answers else ""

    monkeypatch.setattr(sandbox, "_probe", probe)
    first = sandbox.containment(("redis",))
    assert first.transient and not first.namespaces
    measured = len(probes)
    assert sandbox.containment(("redis",)) is first and len(probes) == measured      # the same process, soon after
    real_pid = os.getpid()
    monkeypatch.setattr(sandbox.os, "getpid", lambda: real_pid + 1)                  # a forked grading
    assert sandbox.containment(("redis",)).transient and len(probes) > measured
    monkeypatch.setattr(sandbox, "TRANSIENT_KEPT", 0.0)                               # a minute later
    lasting = sandbox.containment(("redis",))
    assert not lasting.transient and lasting.namespaces == "unshare"
    measured = len(probes)
    assert sandbox.containment(("redis",)) == lasting and len(probes) == measured    # a lasting answer is kept
