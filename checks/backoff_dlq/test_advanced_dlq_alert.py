"""Advanced: `python alert.py` tells an operator that the DLQ is not empty.

A DLQ is quiet: without an alert on its depth it is found weeks later (seed 000's second classic
mistake). alert.py prints the depth and exits 0 while q:tasks:dlq is empty, non-zero (1) when it
holds more entries than `--threshold N` (default 0). It is run twice (runs.py: `advanced_run`):
against an empty DLQ and against one with three entries.
"""
import re

import pytest

from retrylab import runreport
from retrylab.checks.backoff_dlq.catalog import tr
from retrylab.checks.backoff_dlq.lab import DLQ
from retrylab.checks.backoff_dlq.runs import AlertRun
from retrylab.verdict import fail, indent

pytestmark = pytest.mark.advanced("dlq-alert")


def _problem(alert: AlertRun) -> str:
    result, entries = alert.run.result, alert.entries
    if entries:
        state = tr("advanced_msg.dlq-alert.entries", entries=entries, dlq=DLQ)
    else:
        state = tr("advanced_msg.dlq-alert.empty", dlq=DLQ)
    printed = (result.stdout + "\n" + result.stderr).strip()
    if result.stopped:
        return tr("advanced_msg.dlq-alert.still_running", state=state, how=result.describe())
    if "Traceback (most recent call last)" in result.stderr:
        return tr("advanced_msg.dlq-alert.crashed", state=state, stderr=indent(result.stderr_tail()))
    if not entries:
        if result.returncode != 0:
            return tr("advanced_msg.dlq-alert.alert_when_empty", state=state, status=result.returncode)
        return ""
    if result.returncode == 0:
        return tr("advanced_msg.dlq-alert.no_alert", state=state)
    if not re.search(rf"(?<![\d.]){entries}(?![\d.])", printed):
        return tr("advanced_msg.dlq-alert.no_depth", state=state, entries=entries, dlq=DLQ,
                  printed=printed[:200] or tr("advanced_msg.dlq-alert.nothing"))
    if alert.left != entries:
        return tr("advanced_msg.dlq-alert.took_entries", state=state, left=alert.left or 0, dlq=DLQ)
    return ""


def test_alert_reports_dlq_depth_with_its_exit_status(advanced_run, request):
    for alert in advanced_run.alerts:
        runreport.attach_runs(request.node, alert.run)
    if not advanced_run.alerts or advanced_run.alerts[0].run.missing:
        fail(tr("advanced_msg.dlq-alert.missing"))
    problems = [p for p in map(_problem, advanced_run.alerts) if p]
    if problems:
        fail("\n".join(problems))
