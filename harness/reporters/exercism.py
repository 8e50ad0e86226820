"""Exercism test-runner interface, version 3: results.json.

https://exercism.org/docs/building/tooling/test-runners/interface - top-level `status` is pass,
fail or error (error only when nothing could be graded, with `message`); `tests` keep the order of
the steps; `message` is at most 65,535 characters and `output` at most 500.
"""
from __future__ import annotations

import json

from retrylab.results import Report, StepResult

MESSAGE_LIMIT = 65535
OUTPUT_LIMIT = 500
_TRUNCATED = "\n[output truncated]"


def _bounded(text: str, limit: int, notice: str) -> str:
    if len(text) <= limit:
        return text
    return text[:limit - len(notice)] + notice


def _test(result: StepResult) -> dict:
    entry = {
        "name": f"step {result.number}: {result.title}" if result.number is not None else result.name,
        "status": result.status,
    }
    if result.message:
        entry["message"] = _bounded(result.message, MESSAGE_LIMIT, "\n[message truncated]")
    if result.output:
        entry["output"] = _bounded(result.output, OUTPUT_LIMIT, _TRUNCATED)
    if result.number is not None:
        entry["task_id"] = result.number
    return entry


def to_dict(report: Report) -> dict:
    if report.harness_error and not report.results:
        return {"version": 3, "status": "error", "message": report.harness_error, "tests": []}
    status = "error" if report.harness_error else ("pass" if report.lab_passed else "fail")
    data = {"version": 3, "status": status, "tests": [_test(r) for r in report.results]}
    if report.harness_error:
        data["message"] = report.harness_error
    return data


def render(report: Report) -> str:
    return json.dumps(to_dict(report), indent=2, ensure_ascii=False) + "\n"
