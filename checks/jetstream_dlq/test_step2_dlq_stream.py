"""Step 2: setup.py makes stream DLQ, which stores subject dlq.events."""
import pytest

from retrylab import runreport
from retrylab.checks.jetstream_dlq import lab, observe
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.verdict import fail

pytestmark = pytest.mark.step(2)


def _covers(pattern: str, subject: str) -> bool:
    """Whether a stream subject (with * and > wildcards) takes messages published on `subject`."""
    parts, tokens = pattern.split("."), subject.split(".")
    for i, part in enumerate(parts):
        if part == ">":
            return len(tokens) > i
        if i >= len(tokens) or (part != "*" and part != tokens[i]):
            return False
    return len(parts) == len(tokens)


def test_dlq_stream_stores_dlq_events(setup_run, request):
    runreport.attach_runs(request.node, setup_run.first)
    observe.require_script(setup_run.first, "setup.py")
    info = setup_run.dlq
    if info is None:
        fail(tr("step2.no_stream", stream=lab.DLQ_STREAM, found=", ".join(setup_run.streams) or "-",
                how=runreport.how_it_ran(setup_run.first)))
    subjects = (info.get("config") or {}).get("subjects") or []
    if not any(_covers(s, lab.DLQ_SUBJECT) for s in subjects if isinstance(s, str)):
        fail(tr("step2.subject", stream=lab.DLQ_STREAM, subjects=", ".join(map(str, subjects)) or "-",
                subject=lab.DLQ_SUBJECT))
