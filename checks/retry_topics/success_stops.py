"""Step 5 (success-stops): the flaky-1 callback is notified exactly 2 times and the flaky-2 one exactly 3
times (counting both scripts' calls), and neither reaches callbacks.dlq."""
from __future__ import annotations

from retrylab.checks.retry_topics import lab, observe
from retrylab.checks.retry_topics.catalog import tr
from retrylab.fixtures.retry_topics.callbacks import label
from retrylab.verdict import fail


def verify(main_run) -> None:
    observe.require_pair(main_run)
    observe.require_state(main_run)
    scenario = main_run.scenario
    for callback, expected in ((scenario.flaky_1, lab.EXPECTED_CALLS[lab.FLAKY_1]),
                               (scenario.flaky_2, lab.EXPECTED_CALLS[lab.FLAKY_2])):
        calls = main_run.calls_of(callback)
        facts = dict(id=label(callback), merchant=callback["merchant"], count=len(calls), expected=expected)
        if len(calls) < expected:
            observe.incomplete(main_run, tr("step5.too_few", **facts, how=observe.how_both_ran(main_run)))
        if len(calls) > expected:
            fail(tr("step5.too_many", **facts))
        dead = [r for r in main_run.records(lab.DLQ_TOPIC) if r.callback == callback]
        if dead:
            fail(tr("step5.dead", **facts, topic=lab.DLQ_TOPIC, where=dead[0].where))
