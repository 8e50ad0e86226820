"""Advanced: `python alert.py` tells an operator that the DLQ is not empty.

A DLQ is quiet: without an alert on its depth it is found weeks later (seed 000's second classic
mistake). alert.py prints the depth and exits 0 while q:tasks:dlq is empty, non-zero (1) when it
holds more entries than `--threshold N` (default 0). It is run twice (advanced.py: `advanced_run`):
against an empty DLQ and against one with three entries.
"""
import re

import pytest

from retrylab.checks.backoff_dlq import advanced, observe
from retrylab.fixtures.messages import DLQ
from retrylab.verdict import fail, indent

pytestmark = pytest.mark.advanced("dlq-alert")


def _problem(alert: advanced.AlertRun) -> str:
    result, entries = alert.run.result, alert.entries
    state = f"with {entries} entries in {DLQ}" if entries else f"with {DLQ} empty"
    printed = (result.stdout + "\n" + result.stderr).strip()
    if result.stopped:
        return (f"{state}, alert.py was still running after {result.seconds:.0f} s: it must check the depth once, "
                f"report it and exit (a scheduler runs it again).")
    if "Traceback (most recent call last)" in result.stderr:
        return f"{state}, alert.py crashed:\n{indent(result.stderr_tail())}"
    if not entries:
        if result.returncode != 0:
            return f"{state}, alert.py exited with status {result.returncode}; an empty DLQ is no alert: exit 0."
        return ""
    if result.returncode == 0:
        return (f"{state}, alert.py exited with status 0, so no scheduler or monitoring agent would raise an "
                f"alert: exit non-zero (1) when the DLQ holds more than --threshold entries (default 0).")
    if not re.search(rf"(?<![\d.]){entries}(?![\d.])", printed):
        return (f"{state}, alert.py printed no depth {entries}: print a line with the DLQ's depth "
                f"(e.g. `{DLQ} depth={entries}`). It printed: {printed[:200] or 'nothing'}")
    if alert.left != entries:
        return (f"{state}, alert.py left {alert.left or 0} in {DLQ}: an alert only reads the depth (LLEN), it "
                f"never takes entries out.")
    return ""


def test_alert_reports_dlq_depth_with_its_exit_status(advanced_run, request):
    for alert in advanced_run.alerts:
        observe.attach(request.node, alert.run)
    if not advanced_run.alerts or advanced_run.alerts[0].run.missing:
        fail("alert.py is missing from your submission: add a command an operator (or cron) runs to learn the "
             "DLQ's depth; it exits non-zero when the DLQ is not empty.")
    problems = [p for p in map(_problem, advanced_run.alerts) if p]
    if problems:
        fail("\n".join(problems))
