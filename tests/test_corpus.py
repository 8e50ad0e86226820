"""Every corpus submission gets exactly its expected verdict per step, on both backends; the
reference solution passes everything. test_advanced.py reads the same gradings (tests/gradings.py)."""
from __future__ import annotations

import pytest

from retrylab.fixtures.backoff_dlq import corpus
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE

EXERCISE = "backoff-dlq"
BACKENDS = ["fake", "redis-server"]
ENTRIES = corpus.entries()


def _verdicts(report) -> dict[int, str]:
    return {r.number: r.status for r in report.lab_results}


def _explain(report) -> str:
    return "\n".join(f"step {r.number} {r.status}: {r.message}" for r in report.lab_results)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reference_solution_passes_every_step(backend, shared_gradings):
    report = shared_gradings.reference(EXERCISE, REFERENCE, backend)
    assert _verdicts(report) == {n: "pass" for n in range(1, 9)}, _explain(report)
    assert report.exit_status() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_corpus_entry_gets_its_expected_verdicts(entry, backend, shared_gradings):
    report = shared_gradings.entry(EXERCISE, entry, backend)
    assert _verdicts(report) == entry.expect, f"{entry.id}: {entry.why}\n{_explain(report)}"
    assert report.exit_status() == (0 if set(entry.expect.values()) == {"pass"} else 1), _explain(report)
    for result in report.lab_results:
        if result.status == "fail":  # a learner can act on it: says what is wrong, then the hint
            assert result.message.strip() and "Hint:" in result.message


def test_corpus_is_large_enough():
    assert len(corpus.entries("wrong")) >= 20
    assert len(corpus.entries("correct")) >= 6
