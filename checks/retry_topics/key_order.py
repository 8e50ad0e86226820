"""Advanced key-order (reported): order K's "paid" callback fails once and is retried; its "refunded"
callback, produced after it under the same key, must not be notified before "paid" has been notified
successfully. The seed's design (retry topic, main consumer moving on) gives this up and LAB.md accepts it,
so the reference fails this check, saying so; a pair that parks a key's later records behind its pending
retry passes."""
from __future__ import annotations

from retrylab.checks.retry_topics import observe
from retrylab.checks.retry_topics.catalog import tr
from retrylab.verdict import fail


def verify(main_run) -> None:
    observe.require_pair(main_run)
    paid, refunded = main_run.scenario.keyed
    accepted = next((c for c in main_run.calls_of(paid) if c.outcome == "ok"), None)
    later = main_run.calls_of(refunded)
    if accepted is None or not later:
        observe.incomplete(main_run, tr("advanced_msg.key-order.incomplete", id=paid["orderId"],
                                        paid=len(main_run.calls_of(paid)), refunded=len(later),
                                        how=observe.how_both_ran(main_run)))
    if later[0].t < accepted.t:
        fail(tr("advanced_msg.key-order.reordered", id=paid["orderId"],
                minutes=f"{(accepted.t - later[0].t) / 60:.0f}"))
