"""jetstream-dlq: a learner's setup.py that deletes, re-subjects, seals or limits stream EVENTS leaves the harness
nowhere to publish the lab's events. Every step that runs the worker then fails, saying what became of EVENTS
and what setup.py must do instead, never a harness error (found by a hostile-input hunt: exit 2, "no responders
for events.created"). A publish that fails while EVENTS is as the harness made it, or while the server does not
answer the harness either, stays the harness's error: it is no verdict on the learner.

The corpus entries (fixtures/jetstream_dlq/submissions/wrong/setup-*-events) get their verdicts in the corpus
test; here, what their messages say, and the publish's diagnosis on a private nats-server."""
from __future__ import annotations

import pytest

from retrylab import i18n
from retrylab.brokers.nats.admin import JetStreamError, NatsError
from retrylab.brokers.nats.backend import NatsServerBackend
from retrylab.checks.jetstream_dlq import lab, server
from retrylab.checks.jetstream_dlq.run_main import main_batch
from retrylab.checks.jetstream_dlq.run_setup import publish_after_setup, refusal_message
from retrylab.fixtures.jetstream_dlq import corpus
from retrylab.verdict import CheckFailed

EXERCISE = "jetstream-dlq"
RUN_STEPS = (3, 4, 5, 6, 7)
# entry -> what its steps 3-7 and advanced checks must say, beside the lab's stream and subject
SAID = {
    "setup-deletes-events": ("no stream takes events.created", "EVENTS no longer exists"),
    "setup-resubjects-events": ("no stream takes events.created", "subjects event.>"),
    "setup-seals-events": ("EVENTS is sealed",),
    "setup-limits-events": ("maximum messages exceeded", "max_msgs: -1 -> 2", 'discard: "old" -> "new"'),
}
ENTRIES = [e for e in corpus.entries("wrong") if e.name in SAID]
ISOLATES = dict.fromkeys(range(0x2066, 0x206A))


def test_every_entry_of_this_area_is_in_the_corpus():
    assert sorted(e.name for e in ENTRIES) == sorted(SAID)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_steps_that_run_the_worker_fail_saying_what_became_of_events(entry, shared_gradings):
    report = shared_gradings.entry(EXERCISE, entry)
    assert not report.harness_error, report.harness_error
    assert report.exit_status() == 1
    results = [r for r in report.lab_results if r.number in RUN_STEPS] + list(report.advanced_results)
    assert len(results) == len(RUN_STEPS) + 3
    for result in results:
        assert result.status == "fail", f"{result.name}: {result.status}: {result.message}"
        said = result.message.split("Hint:")[0]
        for words in SAID[entry.name]:
            assert words in said, f"{result.name}: {said}"
        assert "setup.py must leave EVENTS as the lab creates it (subjects events.>)" in said, said
        assert "harness failed" not in result.message


# --------------------------------------------------------------------------------------------
# the diagnosis, on a private nats-server


@pytest.fixture(scope="module")
def backend():
    backend = NatsServerBackend()
    backend.start()
    yield backend
    backend.stop()


@pytest.fixture
def admin(backend):
    with backend.private() as endpoint, endpoint.admin() as admin:
        yield admin


class PublishFails:
    """The harness's admin client whose publishes fail with `error` (a lost answer, as a broker failure
    would make): every other request goes to the server."""

    def __init__(self, admin, error: NatsError):
        self._admin, self._error = admin, error

    def js_publish(self, subject, payload=b"", *, headers=b""):
        raise self._error

    def __getattr__(self, name):
        return getattr(self._admin, name)


def test_the_lab_s_stream_untouched_publishes_every_event(admin):
    created = server.create_events_stream(admin)
    batch = main_batch()
    seqs = publish_after_setup(admin, created, batch)
    assert sorted(seqs.values()) == [1, 2, 3, 4] and set(seqs) == {e["id"] for e in batch}


def test_a_harmless_change_to_events_is_no_failure(admin):
    created = server.create_events_stream(admin)
    admin.js(f"STREAM.UPDATE.{lab.STREAM}", {**created["config"], "description": "the learner's words"})
    assert len(publish_after_setup(admin, created, main_batch())) == 4


def test_a_failed_publish_on_the_untouched_stream_stays_the_harness_s_error(admin):
    created = server.create_events_stream(admin)
    lost = NatsError("no answer from the server in 5 s (waiting for a reply on events.created)")
    assert server.refused_by(admin, created, lost) is None
    with pytest.raises(NatsError) as raised:
        publish_after_setup(PublishFails(admin, lost), created, main_batch())
    assert raised.value is lost and not isinstance(raised.value, CheckFailed)


def test_a_server_that_does_not_answer_the_harness_is_no_verdict_on_the_learner(admin):
    created = server.create_events_stream(admin)
    admin.js(f"STREAM.DELETE.{lab.STREAM}")     # the learner's doing: but the server cannot say so any more
    admin.close()
    lost = NatsError("the server closed the connection")
    assert server.refused_by(admin, created, lost) is None
    with pytest.raises(NatsError):
        publish_after_setup(PublishFails(admin, lost), created, main_batch())


def test_a_harmless_change_and_a_lost_answer_stay_the_harness_s_error(admin):
    # a busy machine's lost answer was blamed on any change to EVENTS ("setup.py changed its settings")
    created = server.create_events_stream(admin)
    admin.js(f"STREAM.UPDATE.{lab.STREAM}", {**created["config"], "duplicate_window": 60_000_000_000})
    lost = NatsError("no answer from the server in 5 s (waiting for a reply on events.created)")
    assert server.refused_by(admin, created, lost) is None
    refused = JetStreamError(503, 10077, "maximum messages exceeded")
    assert server.refused_by(admin, created, refused).kind == "changed"     # the server's own refusal


def test_a_deleted_stream_is_the_learner_s_doing(admin):
    created = server.create_events_stream(admin)
    admin.js(f"STREAM.DELETE.{lab.STREAM}")
    with pytest.raises(CheckFailed, match="no stream takes events.created: stream EVENTS no longer exists"):
        publish_after_setup(admin, created, main_batch())


def test_another_stream_taking_the_subject_is_named(admin):
    created = server.create_events_stream(admin)
    admin.js(f"STREAM.DELETE.{lab.STREAM}")
    admin.js("STREAM.CREATE.ORDERS", {"name": "ORDERS", "subjects": ["events.>"], "storage": "memory"})
    with pytest.raises(CheckFailed, match="stream ORDERS takes events.created instead of EVENTS"):
        publish_after_setup(admin, created, main_batch())


def test_a_stream_that_no_longer_acknowledges_is_the_learner_s_doing(admin):
    created = server.create_events_stream(admin)
    admin.js(f"STREAM.UPDATE.{lab.STREAM}", {**created["config"], "no_ack": True})
    admin.timeout = 0.5     # no PubAck ever comes: the publish waits this long, then the server is asked why
    with pytest.raises(CheckFailed, match="no_ack: - -> true"):     # unset before (the server writes no false)
        publish_after_setup(admin, created, main_batch())


@pytest.mark.parametrize("lang", ["en", "zh", "ru", "fa"])
@pytest.mark.parametrize("refusal", [
    server.Refusal("gone"), server.Refusal("resubjected", subjects=("event.>",)),
    server.Refusal("other", other="ORDERS"), server.Refusal("sealed"),
    server.Refusal("changed", changes=("max_msgs: -1 -> 2",), error="maximum messages exceeded"),
], ids=lambda r: r.kind)
def test_each_refusal_reads_in_every_language(lang, refusal):
    with i18n.use(lang):
        message = refusal_message(refusal).translate(ISOLATES)     # fa isolates each Latin run: read without
    assert "{" not in message and lab.STREAM in message, message
    for value in (*refusal.subjects, refusal.other, *refusal.changes, refusal.error):
        assert value in message, message
