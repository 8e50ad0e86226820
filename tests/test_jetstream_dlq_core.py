"""jetstream-dlq's core: steps 3 (ack), 4 (redeliver), 6 (term) and 7 (clean end) on the reference solution and
on the corpus entries of this area, graded on a private nats-server (in the full gradings the corpus test
reads too, tests/gradings.py); and how the main run ends for a worker that is done, one that stopped pulling,
and one whose consumer redelivers for ever."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from retrylab import bidi, i18n
from retrylab import exercise as exercise_module
from retrylab.brokers.nats.backends import make_backend
from retrylab.checks.jetstream_dlq.run_main import QUIET, RETRIES_FOREVER, RUN_TIMEOUT, observe_main
from retrylab.fixtures.jetstream_dlq import corpus
from retrylab.fixtures.jetstream_dlq.corpus import REFERENCE
from retrylab.grading import grade
from retrylab.runner import LearnerRunner
from retrylab.settle import Reason

EXERCISE = "jetstream-dlq"
LOCALES = Path(exercise_module.get(EXERCISE).folder) / "locales"
STEPS = (1, 2, 3, 4, 6, 7)     # step 5 and the advanced checks are graded by their own tests
# this area's entries: the mistakes of steps 3, 4, 6, 7 and the variety of workers and setups
CORE = ("plain-nak", "max-deliver-unset", "ack-none", "ack-all", "ephemeral-consumer", "acks-the-poison",
        "term-for-temporary", "deletes-the-poison", "ack-not-awaited", "nak-when-process-returns-none",
        "stops-after-third-delivery", "never-answers", "exits-at-once", "naks-forever",
        "acks-before-processing", "durable-fetch-one-nak-delay", "nak-delay-two-seconds", "retries-in-process-first", "drain-and-exit", "setup-looks-first",
        "sync-looking-worker")
ENTRIES = [e for e in corpus.entries() if e.name in CORE]


def _verdicts(report) -> dict[int, str]:
    return {r.number: r.status for r in report.lab_results if r.number in STEPS}


def _explain(report) -> str:
    return "\n".join(f"step {r.number} {r.status}: {r.message}" for r in report.lab_results)


def test_every_core_entry_is_in_the_corpus():
    assert sorted(e.name for e in ENTRIES) == sorted(CORE)
    assert sum(e.kind == "correct" for e in ENTRIES) >= 4
    assert set(NAMED) <= set(CORE), "each mistake whose message is asserted has its entry"


def test_reference_passes_steps_3_4_6_7(shared_gradings):
    report = shared_gradings.reference(EXERCISE, REFERENCE)
    assert _verdicts(report) == {n: "pass" for n in STEPS}, _explain(report)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_core_entry_gets_its_expected_verdicts(entry, shared_gradings):
    report = shared_gradings.entry(EXERCISE, entry)
    expected = {n: v for n, v in entry.expect.items() if n in STEPS}
    assert _verdicts(report) == expected, f"{entry.id}: {entry.why}\n{_explain(report)}"
    for result in report.lab_results:
        if result.number in STEPS and result.status == "fail":   # says what is wrong, then the hint
            assert result.message.strip() and "Hint:" in result.message


# what the message of the step that catches each mistake must say (all of it)
NAMED = {"plain-nak": (4, ["plain nak()"]), "ack-none": (3, ["AckPolicy none"]), "ack-all": (3, ["AckPolicy all"]),
         "ephemeral-consumer": (3, ["not from worker-consumer", "durable="]), "term-for-temporary": (4, ["+TERM"]),
         "acks-the-poison": (4, ["was acked"]), "max-deliver-unset": (4, ["delivered 5 times"])}


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.name in NAMED], ids=lambda e: e.id)
def test_the_mistakes_are_named(entry, shared_gradings):
    """Each mistake's message names it, so a learner knows what to change."""
    step, says = NAMED[entry.name]
    message = next(r.message for r in shared_gradings.entry(EXERCISE, entry).lab_results if r.number == step)
    for words in says:
        assert words in message, message


@pytest.fixture(scope="module")
def nats_backend():
    backend = make_backend("nats-server")
    backend.start()
    yield backend
    backend.stop()


def _main_run(folder, nats_backend):
    learner = LearnerRunner(folder, application="retrylab.fixtures.jetstream_dlq.taskproc_app:TaskprocApp",
                            learner_imports=("nats",))
    return observe_main(learner, nats_backend)


def test_main_run_of_the_reference_ends_when_its_work_is_done(nats_backend):
    run = _main_run(REFERENCE, nats_backend)
    assert run.worker.result.reason == Reason.DONE_IDLE.value, run.worker.result
    assert run.resent_at is not None
    # BackOff's 0.5 s + 1 s, then 1 s more before the advisory, then the re-send settles: not QUIET on top
    assert run.worker.timing.settle < QUIET, run.worker.timing


def test_main_run_stops_a_worker_that_stopped_pulling_once_quiet(nats_backend, tmp_path):
    entry = next(e for e in ENTRIES if e.name == "ephemeral-consumer")
    run = _main_run(entry.materialize(tmp_path / "s"), nats_backend)
    assert run.worker.result.reason == Reason.CAP.value and "nothing changed" in run.worker.result.detail
    # stopped by the quiet rule, well before the run's own limit: not a time bound on the machine (CI of
    # e490e34 took 6.1 s under load, past the QUIET + 3 this asserted, for a worker whose start-up was slow)
    assert run.worker.timing.settle >= QUIET, run.worker.timing
    assert run.worker.result.seconds < RUN_TIMEOUT - 1, run.worker.result


def test_main_run_caps_a_consumer_that_redelivers_for_ever(nats_backend, tmp_path):
    entry = next(e for e in ENTRIES if e.name == "max-deliver-unset")
    run = _main_run(entry.materialize(tmp_path / "s"), nats_backend)
    assert run.worker.result.reason == Reason.CAP.value and "delivered one message" in run.worker.result.detail
    assert max(d.delivered for d in run.delivered()) == RETRIES_FOREVER + 1


MY_PARTS = ("core", "step3", "step4", "step6", "step7")
SCRIPTS = {"zh": re.compile(r"[\u4e00-\u9fff]"), "ru": re.compile(r"[\u0400-\u04ff]"),
           "fa": re.compile(r"[\u0600-\u06ff]")}


def _my_keys() -> list[str]:
    folder = LOCALES
    keys = []
    for part in MY_PARTS:
        for section, table in tomllib.loads((folder / f"en.{part}.toml").read_text(encoding="utf-8")).items():
            keys += [f"{section}.{key}" for key in table]
        for lang in SCRIPTS:
            assert (folder / f"{lang}.{part}.toml").is_file(), (lang, part)
    return keys


@pytest.mark.parametrize("lang", sorted(SCRIPTS))
def test_core_messages_in_every_language(lang):
    """Every message of this area exists in the language, in its script, with bidi marks balanced, and keeps
    the names a learner types (worker-consumer, nak(), term()...) as they are."""
    catalog = i18n.exercise_catalog(exercise_module.get(EXERCISE))
    params = {name: "X" for name in ("consumer", "consumers", "stream", "seq", "how", "number", "count",
                                     "deliveries", "answers", "delivered", "gap", "least", "most", "counts",
                                     "seconds", "pending", "unacked", "subject", "subjects", "other", "changes",
                                     "error")}
    keys = [k for k in _my_keys() if not k.startswith("steps.")] + [
        f"steps.{slug}.{field}" for slug in ("ack", "redeliver", "term", "clean-end") for field in ("title", "hint")]
    for key in keys:
        assert catalog.messages[lang].get(key) is not None, key
        text = catalog.text(key, lang, **params)
        assert SCRIPTS[lang].search(text) and bidi.bidi_problems(text) == [], (key, text)
        english = catalog.text(key, "en", **params)
        for name in re.findall(r"[a-z_]+\(\)|worker-consumer|AckPolicy|\+TERM", english):
            assert name in text, (key, name, text)


def test_a_persian_grading_says_what_is_wrong_in_persian(tmp_path):
    entry = next(e for e in ENTRIES if e.name == "plain-nak")
    report = grade(entry.materialize(tmp_path / "s"), exercise_id=EXERCISE, steps=(4,), lang="fa")
    [result] = [r for r in report.lab_results if r.number == 4]
    assert result.status == "fail" and SCRIPTS["fa"].search(result.message.splitlines()[0])
    assert "nak()" in result.message and bidi.bidi_problems(result.message) == []
