"""jetstream-dlq's corpus: every entry of fixtures/jetstream_dlq/submissions/{correct,wrong} gets exactly its
expected verdict per step (and per advanced check where its fixture.toml says) on a private nats-server; the
reference passes everything; and the corpus is large enough: at least 6 correct variants (LAB.md's variety), and
for every mistake LAB.md lists a known-wrong entry that names it in its `why` and fails a step that catches it."""
from __future__ import annotations

import re

import pytest

from retrylab import exercise as exercises
from retrylab.fixtures.jetstream_dlq import corpus
from retrylab.fixtures.jetstream_dlq.corpus import REFERENCE

EXERCISE = "jetstream-dlq"
ENTRIES = corpus.entries()
STEPS = [step.number for step in exercises.get(EXERCISE).steps]
ADVANCED = [check.slug for check in exercises.get(EXERCISE).advanced]

# LAB.md's "Mistakes to catch": how an entry's `why` names the mistake (its words, or close ones), and the
# steps of which the entry must fail at least one
MISTAKES = {
    "plain nak()": (r"plain nak|nak\(\) without (?:a )?delay|bare nak|nak\(\) redelivers at once", {4}),
    "MaxDeliver unset": (r"max.?deliver\b.{0,20}\b(?:unset|not set|missing|left out|-1)|without max.?deliver|"
                         r"no max.?deliver", {1, 4}),
    "AckNone or AckAll": (r"ack.?(?:policy )?(?:none|all)\b|acknone|ackall", {1, 3, 4}),
    "an ephemeral consumer": (r"ephemeral|without durable|no durable", {1, 3, 4, 7}),
    "the advisory JSON published as the dead letter": (
        r"advisory(?:'s)? (?:json|payload|itself)|publishes the advisory", {5}),
    "no Nats-Msg-Id (a duplicate on the re-sent advisory)": (
        r"(?:no|without (?:a |the )?)nats-msg-id|msg.?id (?:header )?(?:missing|left out)", {5}),
    "acking the poison": (r"ack\w* the poison|acks? poison|poison (?:is )?acked", {4}),
    "term() for temporary errors": (r"term\(\)\W.{0,40}temporar|terminat\w* (?:the )?(?:poison|temporary)", {4}),
    "deleting poison from EVENTS": (r"delet\w* (?:the )?poison|poison\b.{0,30}\bdelet", {7}),
    "the wrong advisory subject": (r"wrong advisory|advisory subject|another advisory|other advisory|typo|misspel|"
                                   r"\(not max_deliveries\)|advisory for the dead.letter one", {5}),
    "good messages processed twice": (r"twice|two times|processed again|double", {3}),
}


def _verdicts(report) -> dict[int, str]:
    return {r.number: r.status for r in report.lab_results}


def _advanced(report) -> dict[str, str]:
    return {r.name.split(":", 1)[-1]: r.status for r in report.advanced_results}


def _explain(report) -> str:
    return "\n".join(f"{r.name if r.advanced else f'step {r.number}'} {r.status}: {r.message}"
                     for r in (*report.lab_results, *report.advanced_results))


# the area tests (test_jetstream_dlq_{core,dlq}.py) read the same gradings of the reference and the entries
def test_reference_solution_passes_every_step_and_advanced_check(shared_gradings):
    report = shared_gradings.reference(EXERCISE, REFERENCE)
    assert _verdicts(report) == {n: "pass" for n in STEPS}, _explain(report)
    assert _advanced(report) == {a: "pass" for a in ADVANCED}, _explain(report)
    assert report.exit_status() == 0


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_corpus_entry_gets_its_expected_verdicts(entry, shared_gradings):
    assert sorted(entry.expect) == STEPS, f"{entry.id}: fixture.toml must give a verdict for every step"
    assert set(entry.expect_advanced) <= set(ADVANCED), f"{entry.id}: unknown advanced checks"
    report = shared_gradings.entry(EXERCISE, entry)
    assert _verdicts(report) == entry.expect, f"{entry.id}: {entry.why}\n{_explain(report)}"
    advanced = _advanced(report)
    assert {a: advanced.get(a) for a in entry.expect_advanced} == entry.expect_advanced, \
        f"{entry.id}: {entry.why}\n{_explain(report)}"
    assert not report.harness_error, report.harness_error
    assert report.exit_status() == (0 if set(entry.expect.values()) == {"pass"} else 1), _explain(report)
    for result in report.lab_results:
        if result.status == "fail":  # a learner can act on it: says what is wrong, then the hint
            assert result.message.split("Hint:")[0].strip() and "Hint:" in result.message, result.message


def test_correct_variants_pass_every_step():
    for entry in corpus.entries("correct"):
        assert set(entry.expect.values()) == {"pass"}, f"{entry.id} is filed as correct: {entry.expect}"
    for entry in corpus.entries("wrong"):   # wrong in the lab's steps, or only beyond them (an advanced check)
        assert "fail" in (*entry.expect.values(), *entry.expect_advanced.values()), \
            f"{entry.id} is filed as wrong but fails nothing"


def test_corpus_is_large_enough_and_covers_every_mistake():
    assert len(corpus.entries("correct")) >= 6
    wrong = corpus.entries("wrong")
    uncovered = []
    for mistake, (pattern, steps) in MISTAKES.items():
        if not any(re.search(pattern, entry.why, re.IGNORECASE)
                   and any(entry.expect.get(step) == "fail" for step in steps) for entry in wrong):
            uncovered.append(mistake)
    assert not uncovered, f"no known-wrong entry for: {uncovered}"


@pytest.mark.parametrize("mistake, why, caught", [
    ("plain nak()", "worker.py answers a TemporaryError with a plain nak(): redelivered at once", True),
    ("MaxDeliver unset", "setup.py leaves MaxDeliver unset (-1): the poison is redelivered for ever", True),
    ("AckNone or AckAll", "the consumer is made with AckPolicy none", True),
    ("an ephemeral consumer", "worker.py pulls without durable=, an ephemeral consumer with defaults", True),
    ("the advisory JSON published as the dead letter", "dlq_service.py publishes the advisory's JSON", True),
    ("no Nats-Msg-Id (a duplicate on the re-sent advisory)", "dead letters without a Nats-Msg-Id", True),
    ("acking the poison", "worker.py acks the poison after it fails", True),
    ("term() for temporary errors", "worker.py calls term() on a TemporaryError too", True),
    ("deleting poison from EVENTS", "dlq_service.py deletes the poison from EVENTS", True),
    ("the wrong advisory subject", "dlq_service.py listens to the wrong advisory subject", True),
    ("good messages processed twice", "worker.py processes each good message twice", True),
    ("good messages processed twice", "worker.py acks before processing", False),
    ("plain nak()", "worker.py uses nak(delay=1)", False),
    ("the wrong advisory subject", "the listener subscribes to MAX_DELIVERY (not MAX_DELIVERIES)", True),
    ("the wrong advisory subject", "the listener takes the MSG_TERMINATED advisory for the dead-letter one", True),
    ("the wrong advisory subject", "dead letters without Nats-Msg-Id", False),
])
def test_the_mistake_patterns_read_whys_as_meant(mistake, why, caught):
    """The coverage test above is only as good as its patterns: each finds the words a why would use."""
    assert bool(re.search(MISTAKES[mistake][0], why, re.IGNORECASE)) is caught
