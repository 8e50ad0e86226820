"""retry-topics' corpus: every entry of fixtures/retry_topics/submissions/{correct,wrong} gets exactly its
expected verdict per step (and per advanced check where its fixture.toml says) on a private Tansu broker; the
reference passes every step; and the corpus is large enough: at least 7 correct variants (LAB.md's variety: the
three clients, headers and envelopes, three ways to wait, manual and safe auto-commit), and for every mistake
LAB.md lists a known-wrong entry that names it in its `why` and fails a step that catches it."""
from __future__ import annotations

import re

import pytest

from retrylab import exercise as exercises
from retrylab.fixtures.retry_topics import corpus
from retrylab.fixtures.retry_topics.corpus import REFERENCE
from retrylab.grading import grade

EXERCISE = "retry-topics"
ENTRIES = corpus.entries()
STEPS = [step.number for step in exercises.get(EXERCISE).steps]
ADVANCED = [check.slug for check in exercises.get(EXERCISE).advanced]
# The reference keeps the seed's design: a retried callback is notified after later callbacks of its order,
# which key-order reports (LAB.md: "the seed's design accepts it"); the other advanced checks it passes.
REFERENCE_ADVANCED = {"bounded-concurrency": "pass", "quiet-wait": "pass", "key-order": "fail"}

# LAB.md's "Mistakes to catch": how an entry's `why` names the mistake (its words, or close ones), and the
# steps of which the entry must fail at least one
MISTAKES = {
    "sleeping in the main consumer": (r"sleep\w* (?:\w+ ){0,3}in the main consumer|main consumer (?:\w+ )?sleeps",
                                      {2}),
    "an in-memory retry queue or thread": (r"in-memory retry (?:queue|thread)", {7}),
    "retrying before nextRetryTime": (r"retr\w+ before nextRetryTime|ignoring nextRetryTime", {4}),
    "retrying forever": (r"retr\w+ for ?ever|never gives up", {6}),
    "a counter that never rises": (r"counter that never rises|retryTimes (?:\w+ )?never (?:rises|grows)", {6}),
    "losing the key": (r"\blos\w* the key|without (?:the )?(?:callback's )?key", {3, 6}),
    "a DLQ record without the error": (r"DLQ record without the error", {6}),
    "committing before the retry publish": (r"commit\w* before the retry publish", {7}),
    "never committing": (r"never commit", {1, 7}),
    "a retry consumer with auto.offset.reset=latest and no commit yet": (
        r"auto\.offset\.reset[ =]*latest\b.{0,40}no commit", {7}),
}


def _verdicts(report) -> dict[int, str]:
    return {r.number: r.status for r in report.lab_results}


def _advanced(report) -> dict[str, str]:
    return {r.name.split(":", 1)[-1]: r.status for r in report.advanced_results}


def _explain(report) -> str:
    return "\n".join(f"{r.name if r.advanced else f'step {r.number}'} {r.status}: {r.message}"
                     for r in (*report.lab_results, *report.advanced_results))


def test_reference_solution_passes_every_step():
    report = grade(REFERENCE, exercise_id=EXERCISE)
    assert _verdicts(report) == {n: "pass" for n in STEPS}, _explain(report)
    assert _advanced(report) == REFERENCE_ADVANCED, _explain(report)
    assert report.exit_status() == 0


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_corpus_entry_gets_its_expected_verdicts(entry, tmp_path):
    assert sorted(entry.expect) == STEPS, f"{entry.id}: fixture.toml must give a verdict for every step"
    assert set(entry.expect_advanced) <= set(ADVANCED), f"{entry.id}: unknown advanced checks"
    submission = entry.materialize(tmp_path / "submission")
    report = grade(submission, exercise_id=EXERCISE)
    assert _verdicts(report) == entry.expect, f"{entry.id}: {entry.why}\n{_explain(report)}"
    advanced = _advanced(report)
    assert {a: advanced.get(a) for a in entry.expect_advanced} == entry.expect_advanced, \
        f"{entry.id}: {entry.why}\n{_explain(report)}"
    assert not report.harness_error, report.harness_error
    assert report.exit_status() == (0 if set(entry.expect.values()) == {"pass"} else 1), _explain(report)
    for result in report.lab_results:
        if result.status == "fail":  # a learner can act on it: says what is wrong, then the hint
            assert result.message.split("Hint:")[0].strip() and "Hint:" in result.message, result.message


def test_correct_variants_pass_every_step_and_cover_the_variety():
    correct = corpus.entries("correct")
    for entry in correct:
        assert set(entry.expect.values()) == {"pass"}, f"{entry.id} is filed as correct: {entry.expect}"
    for entry in corpus.entries("wrong"):   # wrong in the lab's steps, or only beyond them (an advanced check)
        assert "fail" in (*entry.expect.values(), *entry.expect_advanced.values()), \
            f"{entry.id} is filed as wrong but fails nothing"
    assert len(correct) >= 7
    # LAB.md's "Variety to accept", read from the entries' own code
    code = {e.name: "\n".join(p.read_text() for p in sorted(e.folder.glob("*.py"))) for e in correct}
    wanted = {"confluent-kafka": r"from confluent_kafka import", "kafka-python": r"from kafka import",
              "aiokafka": r"from aiokafka import", "a JSON envelope": r"envelope", "pause": r"\.pause\(",
              "seek back": r"\.seek\(", "safe auto-commit": r"enable\.auto\.offset\.store\": False"}
    missing = [what for what, pattern in wanted.items() if not any(re.search(pattern, c) for c in code.values())]
    assert not missing, f"no correct entry shows: {missing}"


def test_corpus_covers_every_mistake():
    wrong = corpus.entries("wrong")
    uncovered = []
    for mistake, (pattern, steps) in MISTAKES.items():
        if not any(re.search(pattern, entry.why, re.IGNORECASE)
                   and any(entry.expect.get(step) == "fail" for step in steps) for entry in wrong):
            uncovered.append(mistake)
    assert not uncovered, f"no known-wrong entry for: {uncovered}"


@pytest.mark.parametrize("mistake, why, caught", [
    ("sleeping in the main consumer", "consumer.py sleeps RETRY_INTERVAL_MS in the main consumer", True),
    ("sleeping in the main consumer", "the main consumer sleeps before the next callback", True),
    ("sleeping in the main consumer", "the retry consumer sleeps until due", False),
    ("an in-memory retry queue or thread", "An in-memory retry thread: nothing goes to callbacks.retry", True),
    ("an in-memory retry queue or thread", "an in-memory retry queue drained by one worker", True),
    ("retrying before nextRetryTime", "retry_consumer.py notifies at once, ignoring nextRetryTime", True),
    ("retrying before nextRetryTime", "retrying before nextRetryTime all the same", True),
    ("retrying forever", "the retry consumer never gives up", True),
    ("retrying forever", "down is retried forever", True),
    ("a counter that never rises", "re-published with a counter that never rises", True),
    ("losing the key", "losing the key, on callbacks.retry", True),
    ("losing the key", "the retry record is produced without the callback's key", True),
    ("losing the key", "the key is kept", False),
    ("a DLQ record without the error", "a DLQ record without the error (step 6)", True),
    ("committing before the retry publish", "commits first: committing before the retry publish", True),
    ("never committing", "neither consumer ever commits: never committing", True),
    ("never committing", "commits after the publish", False),
    ("a retry consumer with auto.offset.reset=latest and no commit yet",
     "a retry consumer with auto.offset.reset=latest and no commit yet", True),
    ("a retry consumer with auto.offset.reset=latest and no commit yet",
     "auto.offset.reset earliest, as the reference", False),
])
def test_the_mistake_patterns_read_whys_as_meant(mistake, why, caught):
    """The coverage test above is only as good as its patterns: each finds the words a why would use."""
    assert bool(re.search(MISTAKES[mistake][0], why, re.IGNORECASE)) is caught
