"""retry-topics step 7 (durable) and the advanced checks bounded-concurrency and quiet-wait: the hanging
retries of the durable run, the reference's verdicts in a whole grading, and
step 7's run of the reference with one change at a time that each check must catch."""
from __future__ import annotations

import shutil
import threading
from collections import Counter

import pytest

from retrylab import i18n
from retrylab.appchannel import Argument
from retrylab.brokers.kafka import BROKER
from retrylab.brokers.kafka.backend import TansuBackend
from retrylab.checks.retry_topics.hangs import HangingRetries
from retrylab.checks.retry_topics.run_durable import observe_durable
from retrylab.checks.retry_topics.test_advanced_bounded_concurrency import \
    test_a_burst_of_failures_does_not_grow_the_threads as bounded_concurrency
from retrylab.checks.retry_topics.test_advanced_quiet_wait import \
    test_the_retry_consumer_waits_without_spinning as quiet_wait
from retrylab.checks.retry_topics.test_step7_durable import judge as durable
from retrylab.fixtures.retry_topics import corpus
from retrylab.fixtures.retry_topics.callbacks import new_callback as callback
from retrylab.fixtures.retry_topics.notifier import NotifyError
from retrylab.fixtures.retry_topics.notifier_app import NotifierApp
from retrylab.grading import grade
from retrylab.runner import LearnerRunner
from retrylab.verdict import CheckFailed

EXERCISE = "retry-topics"
CHECKS = {"durable": durable, "bounded-concurrency": bounded_concurrency, "quiet-wait": quiet_wait}


# -- the hanging retries ---------------------------------------------------------------------------

def _notify(app, payload: dict):
    return app.decide("notify", (Argument(text="", type_name="dict", truncated=False, decoded=True, value=payload),))


def test_only_the_first_retry_of_a_target_hangs_and_only_while_armed():
    target, other, later = callback("down"), callback("down"), callback("down")
    notifier = NotifierApp([target, other, later])
    app = HangingRetries(notifier)
    app.target(target["orderId"], later["orderId"])
    assert isinstance(_notify(app, target).error, NotifyError)
    assert _notify(app, target).value == {"hang": True}            # its first retry
    assert isinstance(_notify(app, target).error, NotifyError)      # the retry made again after the restart
    assert isinstance(_notify(app, other).error, NotifyError) and isinstance(_notify(app, other).error, NotifyError)
    _notify(app, later)
    app.disarm()
    assert isinstance(_notify(app, later).error, NotifyError)       # disarmed before its retry came
    assert app.hung == [(target["orderId"], 2)]


# -- the redirect's auto-commit cap (step 7's run sets it) ----------------------------------------------

def test_the_redirect_caps_auto_commit_where_asked_and_leaves_it_alone_otherwise(monkeypatch):
    from retrylab.brokers.kafka import redirect
    assert "auto.commit.interval.ms" not in redirect._librdkafka_conf({"group.id": "g"}, "h:1", 2000, True)
    monkeypatch.setattr(redirect, "_auto_commit_ms", 500)
    assert redirect._librdkafka_conf({"group.id": "g"}, "h:1", 2000, True)["auto.commit.interval.ms"] == 500
    assert redirect._librdkafka_conf({"auto.commit.interval.ms": 100}, "h:1", 2000, True)["auto.commit.interval.ms"] == 100
    assert redirect._python_configs({"auto_commit_interval_ms": 5000}, "h:1", 2000, True)["auto_commit_interval_ms"] == 500
    assert "auto_commit_interval_ms" not in redirect._python_configs({}, "h:1", 2000, False)     # a producer


# -- whole gradings and runs ---------------------------------------------------------------------------

def test_the_reference_passes_step_7_and_both_advanced_checks():
    report = grade(corpus.REFERENCE, exercise_id=EXERCISE)
    results = {r.name: r for r in report.results}
    for name in ("durable", "advanced:bounded-concurrency", "advanced:quiet-wait"):
        assert results[name].status == "pass", f"{name}: {results[name].message}"


@pytest.fixture(scope="module")
def backend():
    backend = TansuBackend()
    backend.start()
    yield backend
    backend.stop()


def _verdicts(run) -> dict[str, str]:
    """Each check's message on `run` ("pass" when it passes), in English."""
    found = {}
    with i18n.use("en"):
        for name, check in CHECKS.items():
            try:
                check(run)
                found[name] = "pass"
            except CheckFailed as failed:
                found[name] = str(failed)
    return found


def _durable_run(tmp_path, backend, changes: dict[str, list[tuple[str, str]]]):
    """Step 7's run of the reference with `changes` (script -> [(old text, new text)]) made."""
    folder = tmp_path / "submission"
    shutil.copytree(corpus.REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
    for script, replacements in changes.items():
        text = (folder / script).read_text()
        for old, new in replacements:
            assert old in text, f"{script} no longer holds {old!r}"
            text = text.replace(old, new)
        (folder / script).write_text(text)
    return observe_durable(LearnerRunner(folder, learner_imports=BROKER.learner_imports), backend, threading.Event())


COMMIT = "            consumer.commit(message=msg, asynchronous=False)\n"
ON_FAILURE = "            except notifier.NotifyError as error:\n"
RETRY_PUBLISH = ("                # the value goes on byte for byte, the retry state rides in headers\n"
                 "                producer.produce(RETRY_TOPIC, key=msg.key(), value=msg.value(), headers=retry_headers(error))\n"
                 "                producer.flush()    # stored before the offset below moves past the original\n")
THREAD_PER_FAILURE = '''

def retry_in_memory(payload: dict) -> None:
    """A thread per failed callback, retrying it itself: nothing of it is in Kafka."""
    for _ in range(2):
        time.sleep(RETRY_INTERVAL_MS / 1000)
        try:
            notifier.notify(payload)
            return
        except notifier.NotifyError:
            pass
'''
IN_MEMORY_QUEUE = '''
RETRIES = queue.Queue()


def retry_in_memory() -> None:
    """One thread retries every failed callback itself, from a queue in memory: nothing of it is in Kafka."""
    while True:
        payload, failed = RETRIES.get()
        time.sleep(RETRY_INTERVAL_MS / 1000)
        try:
            notifier.notify(payload)
        except notifier.NotifyError:
            if failed + 1 < 3:
                RETRIES.put((payload, failed + 1))
'''
SLEEP_UNTIL_DUE = "            if wait > 0:\n                time.sleep(wait)\n"
SPIN_UNTIL_DUE = "            while time.time() < int(header(msg, 'nextRetryTime')) / 1000:\n                pass\n"

# name -> (changes, check that must fail, a phrase of its English message)
WRONG = {
    "commit-before-retry-publish": ({"consumer.py": [(ON_FAILURE, ON_FAILURE + "    " + COMMIT)]},
                                    "durable", "before the record made from it was stored"),
    "never-commits": ({"consumer.py": [(COMMIT, "")]}, "durable", "notified again"),
    "in-memory-retry-queue": ({"consumer.py": [(RETRY_PUBLISH, "                RETRIES.put((json.loads(msg.value()), 1))\n"),
                                               ("import time\n", "import queue\nimport threading\nimport time\n"),
                                               ("\n\ndef main()", IN_MEMORY_QUEUE + "\n\ndef main()"),
                                               ("    consumer.subscribe([TOPIC])\n", "    consumer.subscribe([TOPIC])\n"
                                                "    threading.Thread(target=retry_in_memory, daemon=True).start()\n")]},
                              "durable", "made a retry of"),
    "retry-consumer-starts-at-latest": ({"retry_consumer.py": [('"auto.offset.reset": "earliest"',
                                                                '"auto.offset.reset": "latest"')]},
                                        "durable", "auto.offset.reset"),
    "thread-per-failure": ({"consumer.py": [(RETRY_PUBLISH, "                threading.Thread(target=retry_in_memory,"
                                             " args=(json.loads(msg.value()),), daemon=True).start()\n"),
                                            ("import time\n", "import threading\nimport time\n"),
                                            ("\n\ndef main()", THREAD_PER_FAILURE + "\n\ndef main()")]},
                           "bounded-concurrency", "per failed message"),
    "spinning-retry-consumer": ({"retry_consumer.py": [(SLEEP_UNTIL_DUE, SPIN_UNTIL_DUE)]}, "quiet-wait", "CPU"),
    # dead-lettered one attempt early: nothing was lost in the kill, and the message says so (not `latest`)
    "gives-up-one-attempt-early": ({"retry_consumer.py": [("MAX_ATTEMPTS = 3", "MAX_ATTEMPTS = 2")]},
                                   "durable", "the retries stopped one or more attempts short"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_each_mistake_fails_its_check(name, tmp_path, backend):
    changes, check, phrase = WRONG[name]
    run = _durable_run(tmp_path, backend, changes)
    verdicts = _verdicts(run)
    assert verdicts[check] != "pass" and phrase in verdicts[check], f"{name}: {verdicts}"


def test_the_reference_run_loses_nothing_and_retries_what_hung(tmp_path, backend):
    run = _durable_run(tmp_path, backend, {})
    assert _verdicts(run) == {name: "pass" for name in CHECKS}
    # what the verdicts rest on: one retry hung, and the restart made it again with every pending one
    assert run.hung == ((run.target, 2),) and run.second is not None
    counts = Counter(c.id for c in run.calls)
    assert counts[run.target] == 4 and all(counts[o] == 3 for o in run.burst)
    assert len(run.state.records[("callbacks.dlq", 0)]) == 2 + len(run.burst)
