"""Step 4: jitter.txt holds 20 full-jitter waits for attempt 3."""
import pytest

from retrylab import i18n, plots
from retrylab.checks.backoff_dlq import observe
from retrylab.checks.backoff_dlq.artifacts import JITTER_MAX, parse_jitter, waits_by_line
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.plugin import attach_location
from retrylab.verdict import fail

pytestmark = pytest.mark.step(4)


def test_jitter_is_spread_over_0_to_8(submission, request):
    data = observe.read_artifact(submission, "jitter.txt")
    result = parse_jitter(data)
    if not result.ok:
        attach_location(request.node, "jitter.txt", result.line)
        fail(result.problem + _plot(data))


def _plot(data) -> str:
    """The learner's waits against [0, 8], one row per line: a picture of what is wrong."""
    rows = waits_by_line(data, limit=24)
    if not any(value is not None for _, value in rows):
        return ""

    def note(value):
        if value is None:
            return tr("plot.not_number")
        if value < 0:
            return tr("plot.negative")
        return tr("plot.above", max=JITTER_MAX) if value > JITTER_MAX else ""

    chart = plots.value_bars([v for _, v in rows], band=(0, JITTER_MAX), scale=(0, JITTER_MAX),
                             labels=[str(n) for n, _ in rows], notes=[note(v) for _, v in rows])
    return "\n" + tr("plot.jitter_caption", name="jitter.txt", max=JITTER_MAX) + "\n" + i18n.ltr_lines(chart)
