"""Hostile submissions (fixtures/submissions/hostile): each attacks the harness itself - it spins,
floods stdout, hoards memory, ignores SIGTERM, leaves a daemon, forks without end, writes a huge
file, fills Redis with junk or the wrong types, reads secrets, ships binary artifacts, or scribbles
outside its copy. Grading still gives the expected verdict per step, with no harness error, within
the entry's bound; no process of it is left; the submission is unchanged; nothing secret is in the
report."""
from __future__ import annotations

import hashlib
import os
import re
import time
import uuid
from pathlib import Path

import pytest

from retrylab import procfs, runfs, sandbox
from retrylab.fixtures.backoff_dlq import corpus
from retrylab.grading import grade
from retrylab.reporters import FORMATS

ENTRIES = corpus.entries("hostile")
# these attack the readers of Redis values, which differ by backend, or the application channel
# (calls of taskproc, decided and recorded by the harness): graded on both
CHANNEL_ATTACKS = {"forged-call-log-env", "forged-calls-stub-internals", "forged-calls-raw-socket",
                   "hidden-duplicate", "changed-kind", "call-flood", "malformed-requests", "huge-id-flood"}
BOTH_BACKENDS = {"redis-junk", "redis-wrong-types"} | CHANNEL_ATTACKS
CASES = [(e, "fake") for e in ENTRIES] + [(e, "redis-server") for e in ENTRIES if e.name in BOTH_BACKENDS]
# these get out where the sandbox has no namespaces of its own (partial isolation); test_isolation.py
# grades them on both backends and checks that nothing escaped
NEEDS_ISOLATION = {"proxy-bypass", "shared-service-probe", "persistence", "neighbour"}
SECRETS = {"GITHUB_TOKEN": "ghp_retrylabHostileTestSecret0123456789",
           "AWS_SECRET_ACCESS_KEY": "retrylab/hostile+test/secret/key/0123456789",
           "CI_JOB_TOKEN": "retrylab-hostile-ci-job-token-0123456789"}
# the limit a fixture hits, as its worker steps must name it (unless the machine was so slow that
# the harness stopped the worker, quiet, before it got there)
LIMITS = {"memory-hog": "the 1 GiB memory limit", "huge-file": "the 256 MiB file size limit",
          "fork-bomb": "the limit of 64 processes", "fills-disk": "the 512 MiB limit on all the files a run may write"}
# attacks only a bounded run folder stops (retrylab.runfs: where the harness may mount); elsewhere they would fill
# the disk of the machine running the tests
NEEDS_BOUNDED_DISK = {"fills-disk"}
WORKER_STEPS = (1, 2, 6, 7)
SETTLED = r"worker\.py (kept running after its work was done|was waiting in a blocking read|was stopped: )"  # run.stop
DAEMON_CODE = b"while True: time.sleep(3600)"


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + oct(path.lstat().st_mode).encode())
        if path.is_file() and not path.is_symlink():
            h.update(path.read_bytes())
    return h.hexdigest()


def _daemon_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return DAEMON_CODE in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("entry, backend", CASES, ids=[f"{e.name}-{b}" for e, b in CASES])
def test_hostile_submission_is_graded_safely(entry, backend, tmp_path, monkeypatch):
    if entry.name in NEEDS_ISOLATION and not sandbox.containment().isolated:
        pytest.skip("isolation is partial here: this attack gets out by design")
    if entry.name in NEEDS_BOUNDED_DISK and not runfs.available():
        pytest.skip("the harness may not mount here: a run's folder is not bounded in total")
    submission = entry.materialize(tmp_path / "submission")
    before = _digest(submission)
    tag = f"hostile-{uuid.uuid4().hex}"
    monkeypatch.setenv(sandbox.RUN_TAG_VARIABLE, tag)
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)

    started = time.monotonic()
    report = grade(submission, backend=backend)
    seconds = time.monotonic() - started

    explain = "\n".join(f"{r.name} {r.status}: {r.message[:600]}" for r in report.results)
    assert {r.number: r.status for r in report.lab_results} == entry.expect, f"{entry.why}\n{explain}"
    assert not report.harness_error and all(r.status != "error" for r in report.results), explain
    assert seconds < entry.max_seconds, f"grading took {seconds:.1f} s, over its bound of {entry.max_seconds} s"

    assert procfs.find_processes(tag) == [], "a process of the submission outlived its grading"
    outputs = "\n".join(r.output for r in report.results)
    for pid in map(int, re.findall(r"daemon pid=(\d+)", outputs)):  # one that dropped the run's marker
        assert not _daemon_alive(pid), f"the detached daemon {pid} outlived grading"
    for copy in re.findall(r"copy at (\S+)", outputs):
        assert not os.path.lexists(copy), f"the temporary copy {copy} was not removed"
    assert _digest(submission) == before, "the submission was changed by grading it"

    rendered = "\n".join(render(report) for render in FORMATS.values()) + repr(report)
    for secret in SECRETS.values():
        assert secret not in rendered, "a secret of the harness's environment reached the report"
    for result in report.lab_results:
        if result.status == "fail":  # bounded, and a learner can act on it
            assert "Hint:" in result.message and len(result.message) < 6000, result.message[:300]
    if entry.name in LIMITS:
        for result in report.lab_results:
            if result.number in WORKER_STEPS:
                assert (LIMITS[entry.name] in result.message
                        or re.search(SETTLED, result.message)), result.message


def test_the_hostile_corpus_covers_the_attacks():
    names = {e.name for e in ENTRIES}
    assert {"spin-without-io", "print-forever", "memory-hog", "ignores-sigterm", "detached-daemon",
            "fork-bomb", "fork-hundreds", "huge-file", "fills-disk", "redis-junk", "redis-wrong-types",
            "secret-reader", "binary-artifacts", "scribbler"} | CHANNEL_ATTACKS <= names
    assert all(e.max_seconds for e in ENTRIES)
    assert not names & {e.name for e in corpus.entries()}, "hostile entries stay out of the default corpus"
