"""Step 5: capped.txt holds the backoff for attempts 0..8 with a 30 s cap."""
import pytest

from retrylab import i18n, plots
from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.artifacts import CAP, CAPPED_WAITS, parse_capped, waits_by_line
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.plugin import attach_location
from retrylab.verdict import fail

pytestmark = pytest.mark.step(5)


def test_backoff_is_capped_at_30(submission, request):
    data = observe.read_artifact(submission, "capped.txt")
    result = parse_capped(data)
    if not result.ok:
        attach_location(request.node, "capped.txt", result.line)
        fail(result.problem + _plot(data))


def _plot(data) -> str:
    """The learner's wait per attempt (the n-th line is attempt n) against the cap, on [0, 32]."""
    rows = waits_by_line(data, limit=len(CAPPED_WAITS) + 3)
    if not any(value is not None for _, value in rows):
        return ""
    values = [value for _, value in rows]
    notes = []
    for attempt, value in enumerate(values):
        want = CAPPED_WAITS[attempt] if attempt < len(CAPPED_WAITS) else None
        if value is None:
            notes.append(tr("plot.not_number"))
        elif want is not None and value != want:
            notes.append(tr("plot.expected", value=want))
        else:
            notes.append("")
    chart = plots.value_bars(values, band=(0, CAP), scale=(0, 32), labels=[str(n) for n in range(len(values))],
                             notes=notes)
    return "\n" + tr("plot.cap_caption", cap=CAP) + "\n" + i18n.ltr_lines(chart)
