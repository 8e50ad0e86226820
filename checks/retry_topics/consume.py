"""Step 1 (consume): every ok callback notified exactly once, by either script, and group notifier's
committed offsets at the end of each partition of callbacks, exactly (neither short of it nor past it) (ends from the harness's own delivery
reports; committed offsets as the broker reports them after the run)."""
from __future__ import annotations

from retrylab.checks.retry_topics import lab, observe
from retrylab.checks.retry_topics.catalog import tr
from retrylab.fixtures.retry_topics.callbacks import label
from retrylab.verdict import fail


def verify(main_run) -> None:
    observe.require_main(main_run)
    oks = main_run.scenario.ok
    for callback in oks:
        calls = main_run.calls_of(callback)
        if not calls:
            missed = sum(1 for c in oks if not main_run.calls_of(c))
            fail(tr("step1.not_notified", id=label(callback), count=missed, total=len(oks),
                    how=observe.how_both_ran(main_run)))
        if len(calls) > 1:
            fail(tr("step1.notified_again", id=label(callback), count=len(calls)))
    observe.require_state(main_run)
    committed = main_run.committed(lab.MAIN_GROUP)
    for (topic, partition), end in sorted(main_run.ends().items()):
        offset = committed.get((topic, partition))
        if offset is None:
            fail(tr("step1.not_committed", group=lab.MAIN_GROUP, topic=topic, partition=partition, end=end))
        if offset < end:
            fail(tr("step1.behind", group=lab.MAIN_GROUP, topic=topic, partition=partition, offset=offset, end=end))
        if offset > end:    # past every record: a restart would find nothing there (or be reset)
            fail(tr("step1.beyond", group=lab.MAIN_GROUP, topic=topic, partition=partition, offset=offset, end=end))
