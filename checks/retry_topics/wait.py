"""Step 4 (wait): retry_consumer.py notifies a retried callback no earlier than the nextRetryTime of the
record it retries, and the attempts of one callback (both scripts' calls) are at least one interval apart.

The k-th retry call of a callback is matched with the k-th record carrying it on callbacks.retry, in the
order they were produced (not by retryTimes: a counter that never rises is step 6's to report). Times are
the shared virtual clock's, on which a correct retry consumer's sleep ends exactly at the due time:
TOLERANCE only absorbs rounding to whole milliseconds."""
from __future__ import annotations

from retrylab.checks.retry_topics import lab, observe
from retrylab.checks.retry_topics.catalog import tr
from retrylab.fixtures.retry_topics.callbacks import label
from retrylab.verdict import fail

TOLERANCE = 1.0     # seconds of virtual time


def verify(main_run) -> None:
    observe.require_pair(main_run)
    observe.require_state(main_run)
    retried = [c for c in main_run.published if main_run.calls_of(c, main_run.retry)]
    if not retried:
        observe.incomplete(main_run, tr("step4.no_retry", script=lab.RETRY_SCRIPT, topic=lab.RETRY_TOPIC,
                                        group=lab.RETRY_GROUP, how=observe.how_both_ran(main_run)))
    on_topic = main_run.records(lab.RETRY_TOPIC)
    for callback in retried:
        own = sorted((r for r in on_topic if r.callback == callback and r.produced is not None),
                     key=lambda r: r.produced.at)
        for number, call in enumerate(main_run.calls_of(callback, main_run.retry), 1):
            # a nextRetryTime that is no plausible time ("--1", 400 zeros too many) gives no due time to wait
            # for: step 3 reports consumer.py's; a wrong interval between the attempts is still caught below
            due = own[number - 1].due if number <= len(own) else None
            if due is not None and call.t < due - TOLERANCE:
                fail(tr("step4.early", id=label(callback), number=number, where=own[number - 1].where,
                        early=f"{due - call.t:.0f}", name=lab.NEXT_RETRY_TIME))
        calls = main_run.calls_of(callback)
        for earlier, later in zip(calls, calls[1:]):
            if later.t - earlier.t < lab.INTERVAL - TOLERANCE:
                fail(tr("step4.too_close", id=label(callback), gap=f"{later.t - earlier.t:.0f}",
                        interval=f"{lab.INTERVAL:.0f}"))
