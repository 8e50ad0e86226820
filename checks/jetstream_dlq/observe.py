"""Reading what the learner's scripts did, in the lab's terms, with messages a learner can act on."""
from __future__ import annotations

from retrylab.appchannel import describe_call_limit, describe_malformed
from retrylab.calllog import MALFORMED
from retrylab.checks.jetstream_dlq import lab
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.runner import ScriptRun
from retrylab.runreport import how_it_ran
from retrylab.verdict import fail


def require_script(run: ScriptRun | None, script: str) -> None:
    if run is None or run.missing:
        fail(tr("observe.script_missing", script=script))


def require_honest_calls(run: ScriptRun) -> None:
    if run.call_limit is not None:
        fail(describe_call_limit(run.result.script, run.call_limit))
    for call in run.calls:
        if call.outcome == MALFORMED:
            fail(tr("observe.malformed", problem=describe_malformed(call)))
        if call.altered is not None:
            fail(tr("observe.altered", id=call.id, key=call.altered))


def worker_deliveries(main_run) -> list:
    """The deliveries worker.py received from worker-consumer; a failed step if it received none, or any from
    another consumer (`pull_subscribe` without `durable=` makes an ephemeral one with the server's defaults:
    no MaxDeliver, no BackOff, AckWait 30 s)."""
    require_script(main_run.worker, "worker.py")
    require_honest_calls(main_run.worker)
    found = main_run.delivered()
    others = sorted({d.consumer for d in found} - {lab.CONSUMER})
    if others:
        fail(tr("deliveries.other_consumer", consumers=", ".join(others), consumer=lab.CONSUMER,
                stream=lab.STREAM))
    if not found:
        fail(tr("deliveries.none", consumer=lab.CONSUMER, how=how_it_ran(main_run.worker)))
    return found


def require_explicit_acks(main_run) -> None:
    """AckPolicy none or all make the worker's answers mean something else (see the messages)."""
    policy = main_run.ack_policy()
    if policy == "none":
        fail(tr("deliveries.ack_none", consumer=lab.CONSUMER))
    if policy == "all":
        poison = main_run.event("poison")
        fail(tr("deliveries.ack_all", consumer=lab.CONSUMER, seq=main_run.seqs[poison["id"]]))
