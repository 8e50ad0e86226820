"""Advanced: nothing takes an entry out of the DLQ on its own; only replay.py, run by a person, does.

A DLQ consumer that re-processes automatically loops for as long as the cause remains (seed 000's
first classic mistake). The run starts with one entry already in the DLQ, and the worker adds its own.
"""
import pytest

from retrylab import runreport
from retrylab.checks.backoff_dlq import advanced, observe
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.checks.backoff_dlq.lab import DLQ
from retrylab.verdict import fail


pytestmark = pytest.mark.advanced("no-auto-replay")


def test_dlq_entries_stay_until_replay_runs(advanced_run, request):
    run = advanced_run.run
    runreport.attach_runs(request.node, run)
    observe.require_script(run, "worker.py")
    left = set(advanced_run.dlq.values) if advanced_run.dlq is not None and advanced_run.dlq.type == "list" else set()
    old = advanced_run.preseeded
    replayed = len(advanced_run.calls_for(old))
    if replayed:
        fail(tr("advanced_msg.no-auto-replay.replayed", dlq=DLQ, calls=replayed))
    removals = advanced.dlq_removals(run.commands)
    if removals:
        command = advanced.show_command(removals[0])
        if len(removals) > 1:
            fail(tr("advanced_msg.no-auto-replay.removed_more", dlq=DLQ, command=command, more=len(removals) - 1))
        fail(tr("advanced_msg.no-auto-replay.removed", dlq=DLQ, command=command))
    if advanced_run.preseeded_entry not in left:
        fail(tr("advanced_msg.no-auto-replay.preseeded_gone", dlq=DLQ))
    gone = sorted(i for i in advanced.dead_lettered_ids(run.commands)
                  if not any(i.encode() in v for v in left))
    if gone:
        fail(tr("advanced_msg.no-auto-replay.gone", count=len(gone), dlq=DLQ, id=gone[0]))
