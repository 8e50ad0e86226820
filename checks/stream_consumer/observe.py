"""Reading what the learner's scripts did, in the lab's terms, with messages a learner can act on."""
from __future__ import annotations

from collections import Counter
from typing import Iterable

from retrylab.appchannel import describe_call_limit, describe_malformed
from retrylab.calllog import MALFORMED
from retrylab.checks.stream_consumer.catalog import tr
from retrylab.runner import ScriptRun
from retrylab.verdict import fail


def require_script(run: ScriptRun, script: str) -> None:
    if run.missing:
        fail(tr("observe.script_missing", script=script))


def require_honest_calls(run: ScriptRun, seeded: Iterable[dict]) -> None:
    """Fail unless every call was a readable call of apply, within the run's limit, with each seeded
    entry's fields as they were added (its outcome follows the kind it was added with anyway)."""
    if run.call_limit is not None:
        fail(describe_call_limit(run.result.script, run.call_limit))
    orders = {o["order_id"]: o for o in seeded}
    for call in run.calls:
        if call.outcome == MALFORMED:
            fail(tr("observe.malformed", problem=describe_malformed(call)))
        if call.altered is not None and call.id in orders:
            fail(tr("observe.altered", id=call.id, key=call.altered, added=orders[call.id].get(call.altered, "")))


def effects(run: ScriptRun) -> Counter:
    """Effects applied per order id: calls of apply that returned."""
    return Counter(c.id for c in run.calls if c.outcome == "ok")


def calls_for(run: ScriptRun, order_id: str) -> list:
    return sorted((c for c in run.calls if c.id == order_id), key=lambda c: c.t)
