"""Step 2 (non-blocking): after a failed notify, consumer.py goes on with the callbacks behind the failing one
(in its partition, of other orders) within half an interval: it notifies each, or hands it to callbacks.retry
at once (a pair that keeps a key's order parks a key's later records behind its pending retry: a later
callback of the same order, or of an order that failed before it, rightly waits there). Judged by
consumer.py's OWN waiting (real time and its own sleeps, timeline.own_wait), never by the shared clock, which
the retry consumer moves by an interval meanwhile."""
from __future__ import annotations

from retrylab.checks.retry_topics import lab, observe, timeline
from retrylab.checks.retry_topics.catalog import tr
from retrylab.fixtures.retry_topics.callbacks import label
from retrylab.verdict import fail

HALF_INTERVAL = lab.INTERVAL / 2


def handled_at(main_run, callback) -> float | None:
    """The real time consumer.py first notified `callback` or handed it to callbacks.retry (None: never)."""
    times = [timeline.real_time(c) for c in main_run.calls_of(callback, main_run.main)[:1]]
    times += [r.produced.at for r in main_run.records(lab.RETRY_TOPIC)
              if r.callback == callback and r.produced is not None and r.produced.script == lab.MAIN_SCRIPT]
    return min(times, default=None)


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
            handled = handled_at(main_run, later)
            if handled is None:
                fail(tr("step2.not_reached", id=label(callback), later=label(later), how=observe.how_it_ran(main)))
            waited = timeline.own_wait(main_run.main_clock, failure, handled)
            if waited > HALF_INTERVAL:
                fail(tr("step2.waited", id=label(callback), later=label(later), seconds=f"{waited:.0f}",
                        most=f"{HALF_INTERVAL:.0f}", interval=f"{lab.INTERVAL:.0f}"))
            judged += 1
    if not judged:
        fail(tr("step2.no_failure", script=lab.MAIN_SCRIPT, how=observe.how_it_ran(main)))
