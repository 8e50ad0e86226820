"""stream-consumer's corpus: every entry of fixtures/stream_consumer/submissions/{correct,wrong} gets exactly its
expected verdict per step on both backends; the reference passes everything; and the corpus is large enough:
at least 6 correct variants, and for every mistake LAB.md lists a known-wrong entry that names it in its
`why` and fails the step that catches it."""
from __future__ import annotations

import re

import pytest

from retrylab import exercise as exercises
from retrylab.fixtures.stream_consumer import corpus
from retrylab.fixtures.stream_consumer.corpus import REFERENCE
from retrylab.grading import grade

EXERCISE = "stream-consumer"
BACKENDS = ["fake", "redis-server"]
ENTRIES = corpus.entries()
STEPS = [step.number for step in exercises.get(EXERCISE).steps]

# LAB.md's "Mistakes to catch": how an entry's `why` names the mistake (its words, or close ones), and the
# steps of which the entry must fail at least one
MISTAKES = {
    "immediate endless retries": (r"immediate|at once|without (?:any |a )?wait|no (?:idle|wait)|min.idle (?:of )?0", {2}),
    "no DLQ (poison retried forever or dropped)": (r"no dlq|without (?:a |the )?dlq|forever|drop|never dead.letter", {3}),
    "XACK before the effect": (r"xack\w* before|ack\w* before the effect", {2, 3, 4}),
    "applies twice on redelivery": (r"twice|two times|again on redelivery|no idempoten|without idempoten", {4}),
    "idempotency key not removed when the effect raises": (
        r"not (?:removed|deleted)|not remove|never (?:removed|deleted)|(?:keeps|left|kept)\b.*\bkey|key\b.*\b(?:kept|left|stays)",
        {2, 3}),
    "lag from XLEN alone": (r"xlen", {5}),
    "MAXLEN trimming as backpressure": (r"maxlen|xtrim|trim", {6}),
    "a producer that ignores lag": (r"ignor\w* (?:the )?lag|never (?:checks|reads|looks at) the lag|no backpressure", {6}),
    "refusals not recorded": (r"refus\w*\b.*\bnot recorded|not record\w*\b.*\brefus|unrecorded|without recording", {6}),
    "a fabricated lag series": (r"fabricat|invent|made.up|fake[sd]? (?:lag|series)|constant", {5}),
}


def _verdicts(report) -> dict[int, str]:
    return {r.number: r.status for r in report.lab_results}


def _explain(report) -> str:
    return "\n".join(f"step {r.number} {r.status}: {r.message}" for r in report.lab_results)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reference_solution_passes_every_step(backend):
    report = grade(REFERENCE, backend=backend, exercise_id=EXERCISE)
    assert _verdicts(report) == {n: "pass" for n in STEPS}, _explain(report)
    assert report.exit_status() == 0


# the area tests (test_stream_consumer_{retry,idempotent,lag,backpressure}.py) read the same gradings
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_corpus_entry_gets_its_expected_verdicts(entry, backend, shared_gradings):
    assert sorted(entry.expect) == STEPS, f"{entry.id}: fixture.toml must give a verdict for every step"
    report = shared_gradings.entry(EXERCISE, entry, backend)
    assert _verdicts(report) == entry.expect, f"{entry.id}: {entry.why}\n{_explain(report)}"
    assert not report.harness_error, report.harness_error
    assert report.exit_status() == (0 if set(entry.expect.values()) == {"pass"} else 1), _explain(report)
    for result in report.lab_results:
        if result.status == "fail":  # a learner can act on it: says what is wrong, then the hint
            assert result.message.split("Hint:")[0].strip() and "Hint:" in result.message, result.message


def test_correct_variants_pass_every_step():
    for entry in corpus.entries("correct"):
        assert set(entry.expect.values()) == {"pass"}, f"{entry.id} is filed as correct: {entry.expect}"
    for entry in corpus.entries("wrong"):
        assert "fail" in entry.expect.values(), f"{entry.id} is filed as wrong but fails nothing"


def test_corpus_is_large_enough_and_covers_every_mistake():
    assert len(corpus.entries("correct")) >= 6
    wrong = corpus.entries("wrong")
    uncovered = []
    for mistake, (pattern, steps) in MISTAKES.items():
        if not any(re.search(pattern, entry.why, re.IGNORECASE)
                   and any(entry.expect.get(step) == "fail" for step in steps) for entry in wrong):
            uncovered.append(mistake)
    assert not uncovered, f"no known-wrong entry for: {uncovered}"
