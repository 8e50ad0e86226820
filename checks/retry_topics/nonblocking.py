"""Step 2 (non-blocking): after a failed notify, consumer.py goes on with the callbacks behind the failing one
(in its partition, of other orders: a later callback of the same order may rightly wait behind it) within
half an interval. Judged by consumer.py's OWN waiting (real time and its own sleeps, timeline.own_wait),
never by the shared clock, which the retry consumer moves by an interval meanwhile."""
from __future__ import annotations

from retrylab.checks.retry_topics import lab, observe, timeline
from retrylab.checks.retry_topics.catalog import tr
from retrylab.fixtures.retry_topics.callbacks import label
from retrylab.verdict import fail

HALF_INTERVAL = lab.INTERVAL / 2


def verify(main_run) -> None:
    observe.require_main(main_run)
    main = main_run.main
    judged = 0
    for callback in main_run.published:
        failure = timeline.first_failure(main_run.calls_of(callback, main))
        if failure is None:
            continue
        for later in main_run.behind(callback):
            if later["orderId"] == callback["orderId"]:
                continue
            calls = main_run.calls_of(later, main)
            if not calls:
                fail(tr("step2.not_reached", id=label(callback), later=label(later), how=observe.how_it_ran(main)))
            waited = timeline.own_wait(main_run.main_clock, failure, calls[0])
            if waited > HALF_INTERVAL:
                fail(tr("step2.waited", id=label(callback), later=label(later), seconds=f"{waited:.0f}",
                        most=f"{HALF_INTERVAL:.0f}", interval=f"{lab.INTERVAL:.0f}"))
            judged += 1
    if not judged:
        fail(tr("step2.no_failure", script=lab.MAIN_SCRIPT, how=observe.how_it_ran(main)))
