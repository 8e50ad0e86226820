"""The human report: one line per step, the failure detail under it, and a tally."""
from __future__ import annotations

from retrylab.results import Report, StepResult

_MARK = {"pass": "PASS", "fail": "FAIL", "error": "ERROR"}


def _line(result: StepResult) -> str:
    label = f"step {result.number}" if result.number is not None else result.name
    return f"{_MARK[result.status]:<5} {label}: {result.title}"


def render(report: Report) -> str:
    lines = [f"retrylab {report.harness_version} - {report.exercise_id}: {report.exercise_title}",
             f"submission: {report.submission}  (backend: {report.backend})", ""]
    for result in report.lab_results:
        lines.append(_line(result))
        if not result.passed and result.message:
            lines.extend("      " + part for part in result.message.splitlines())
    if report.advanced_results:
        lines += ["", "Advanced checks (reported apart; they do not change the lab's result):"]
        for result in report.advanced_results:
            lines.append(_line(result))
            if not result.passed and result.message:
                lines.extend("      " + part for part in result.message.splitlines())
    passed = sum(r.passed for r in report.lab_results)
    lines += ["", f"{passed}/{len(report.lab_results)} steps pass ({report.seconds:.1f} s)"]
    if report.harness_error:
        lines.append(f"retrylab could not grade everything: {report.harness_error}")
    return "\n".join(lines) + "\n"
