"""Step 1: setup.py makes durable pull consumer worker-consumer on EVENTS with the lab's settings, and
running it again is harmless."""
import pytest

from retrylab import runreport
from retrylab.checks.jetstream_dlq import lab, observe
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.step(1)


def _seconds(ns) -> str:
    return f"{ns / 1e9:g} s" if isinstance(ns, (int, float)) else str(ns)


def test_consumer_has_the_labs_settings(setup_run, request):
    runreport.attach_runs(request.node, setup_run.first, setup_run.second)
    observe.require_script(setup_run.first, "setup.py")
    info = setup_run.consumer
    if info is None:
        fail(tr("step1.no_consumer", consumer=lab.CONSUMER, stream=lab.STREAM,
                found=", ".join(setup_run.consumers) or "-", how=runreport.how_it_ran(setup_run.first)))
    config = info.get("config") or {}
    if not config.get("durable_name"):
        fail(tr("step1.not_durable", consumer=lab.CONSUMER))
    if config.get("deliver_subject"):
        fail(tr("step1.push", consumer=lab.CONSUMER))
    if config.get("ack_policy") != "explicit":
        fail(tr("step1.ack_policy", consumer=lab.CONSUMER, policy=config.get("ack_policy", "none")))
    if config.get("max_deliver") != lab.MAX_DELIVER:
        fail(tr("step1.max_deliver", consumer=lab.CONSUMER, value=config.get("max_deliver", -1)))
    if list(config.get("backoff") or []) != lab.BACKOFF_NS:
        fail(tr("step1.backoff", consumer=lab.CONSUMER, value=", ".join(_seconds(b) for b in config.get("backoff") or []) or "-"))
    subjects = config.get("filter_subjects") or ([config["filter_subject"]] if config.get("filter_subject") else [])
    if subjects != [lab.SUBJECT]:
        fail(tr("step1.filter", consumer=lab.CONSUMER, value=", ".join(subjects) or "-", subject=lab.SUBJECT))
    if config.get("ack_wait") not in (lab.ACK_WAIT_NS, lab.BACKOFF_NS[0]):
        fail(tr("step1.ack_wait", consumer=lab.CONSUMER, value=_seconds(config.get("ack_wait"))))
    second = setup_run.second
    if second is not None and (second.result.crashed or second.result.returncode not in (0, None)):
        fail(tr("step1.second_run_failed", how=runreport.how_it_ran(second)))
    again = setup_run.consumer_again
    if again is None or (again.get("config") or {}) != config:
        fail(tr("step1.second_run_changed", consumer=lab.CONSUMER))
