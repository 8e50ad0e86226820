"""Step 1: consumer.py reads `orders` in group `workers` (creating it), applies each entry once, XACKs it."""
import pytest

from retrylab import runreport
from retrylab.checks.stream_consumer import lab, observe
from retrylab.checks.stream_consumer.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.step(1)


def test_group_reads_applies_once_and_acks(consume_run, request):
    run = consume_run.run
    runreport.attach_runs(request.node, run)
    observe.require_script(run, "consumer.py")
    observe.require_honest_calls(run, consume_run.seeded)
    group = consume_run.group
    if group is None:
        fail(tr("step1.no_group", group=lab.GROUP, stream=lab.STREAM, how=runreport.how_it_ran(run)))
    if not any(c.name == "XREADGROUP" for c in run.commands):
        fail(tr("step1.no_xreadgroup", group=lab.GROUP))
    effects = observe.effects(run)
    seeded = consume_run.seeded
    missing = [o for o in seeded if effects[o["order_id"]] == 0]
    if missing:
        fail(tr("step1.not_applied", missing=len(missing), total=len(seeded), id=missing[0]["order_id"],
                how=runreport.how_it_ran(run)))
    twice = [o for o in seeded if effects[o["order_id"]] > 1]
    if twice:
        fail(tr("step1.applied_twice", id=twice[0]["order_id"], count=effects[twice[0]["order_id"]]))
    if consume_run.pending:
        fail(tr("step1.still_pending", count=len(consume_run.pending), group=lab.GROUP))
    if group.undelivered:
        fail(tr("step1.undelivered", count=group.undelivered, group=lab.GROUP))
