"""Advanced: nothing takes an entry out of the DLQ on its own; only replay.py, run by a person, does.

A DLQ consumer that re-processes automatically loops for as long as the cause remains (seed 000's
first classic mistake). The run starts with one entry already in the DLQ, and the worker adds its own.
"""
import pytest

from retrylab.checks.backoff_dlq import advanced, observe
from retrylab.fixtures.messages import DLQ
from retrylab.verdict import fail


pytestmark = pytest.mark.advanced("no-auto-replay")


def test_dlq_entries_stay_until_replay_runs(advanced_run, request):
    run = advanced_run.run
    observe.attach(request.node, run)
    observe.require_script(run, "worker.py")
    left = set(advanced_run.dlq.values) if advanced_run.dlq is not None and advanced_run.dlq.type == "list" else set()
    old = advanced_run.preseeded
    replayed = len(advanced_run.calls_for(old))
    if replayed:
        fail(f"{DLQ} held an entry from an earlier failure when the worker started, and the worker processed "
             f"that message again ({replayed} call(s) of process): the DLQ must only be replayed by a person "
             f"running replay.py, never automatically.")
    removals = advanced.dlq_removals(run.commands)
    if removals:
        fail(f"the worker took entries out of {DLQ} ({advanced.show_command(removals[0])}"
             f"{f' and {len(removals) - 1} more' if len(removals) > 1 else ''}): dead letters stay until a person "
             f"replays them with replay.py. Re-processing them automatically loops while the cause remains; "
             f"trimming or deleting them loses them.")
    if advanced_run.preseeded_entry not in left:
        fail(f"the entry that was in {DLQ} before the worker started is gone after the run: the worker must "
             f"leave the DLQ alone.")
    gone = sorted(i for i in advanced.dead_lettered_ids(run.commands)
                  if not any(i.encode() in v for v in left))
    if gone:
        fail(f"{len(gone)} message(s) the worker put in {DLQ} are no longer there after the run (e.g. id {gone[0]}): "
             f"nothing but replay.py may take them out.")
