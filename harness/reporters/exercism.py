"""Exercism test-runner interface, version 3: results.json.

https://exercism.org/docs/building/tooling/test-runners/interface
- top level: `version` 3; `status` pass (every test passed), fail (a test failed or errored) or
  error (no test could be executed), with `message` only for error (the spec: null or absent
  otherwise). Its message is limited to 65,535 characters, less when multi-byte characters are in
  it: here every message is bounded to 65,535 UTF-8 bytes, which is never more characters.
- `tests`, in the order of the steps: `name`, `status`, `message` (failures), `output` (what the
  learner's scripts printed, at most 500 characters), `task_id` (the lab step; a test is linked to a
  task only when it belongs to exactly one, so advanced checks have none and a name `advanced:<id>`).
  `test_code` is left out: it is required for Concept Exercises only, and a lab step's check is not a
  line of code a learner could read; the step's hint is in its message.

One deliberate reading: a failed advanced check does not turn the top-level status to fail. The lab's
result is its steps' (as the exit status and the other reporters say); an optional advanced check
must not fail a learner who did the lab. Its own test entry still says fail.

Human text (test names, notices, fallback messages) is in the report's language; the fields the spec
defines (status values, task_id, the `advanced:` prefix of a name) are the same in every language.
"""
from __future__ import annotations

import json

from retrylab import i18n
from retrylab.reporters.bounds import bounded, language, utf8_safe
from retrylab.reporters.github import inert_json
from retrylab.results import Report, StepResult

MESSAGE_LIMIT = 65535   # UTF-8 bytes (the spec's characters, less with multi-byte text)
OUTPUT_LIMIT = 500      # characters


def display_name(result: StepResult, lang: str = i18n.DEFAULT) -> str:
    """"step 3: <title>" in `lang`; an advanced check keeps its `advanced:<id>` name in front."""
    if not result.advanced:
        return i18n.label("formats.step_title", lang, number=result.number, title=result.title)
    return f"{result.name}: {result.title}" if result.title else result.name


def in_step_order(results) -> list[StepResult]:
    """Lab steps by number, then advanced checks as listed (the spec: tests in the tests file's order)."""
    return sorted(results, key=lambda r: (r.advanced, r.number or 0))


def _test(result: StepResult, lang: str) -> dict:
    entry: dict = {"name": utf8_safe(display_name(result, lang)), "status": result.status}
    if result.message and not result.passed:
        entry["message"] = bounded(utf8_safe(result.message), MESSAGE_LIMIT, "message", utf8=True, lang=lang)
    if result.output:
        entry["output"] = bounded(utf8_safe(result.output), OUTPUT_LIMIT, "output", lang=lang)
    if not result.advanced:
        entry["task_id"] = result.number
    return entry


def _nothing_ran(report: Report) -> bool:
    """No lab step was judged (passed or failed): the run as a whole errored."""
    return all(r.status == "error" for r in report.lab_results)


def _error_message(report: Report) -> str:
    if report.harness_error:
        return report.harness_error
    reasons = list(dict.fromkeys(r.message for r in report.lab_results if r.message))
    return "; ".join(reasons) or i18n.label("formats.nothing_ran", language(report))


def to_dict(report: Report) -> dict:
    lang = language(report)
    tests = [_test(r, lang) for r in in_step_order(report.results)]
    if _nothing_ran(report) or getattr(report, "interrupted", False):   # an incomplete grading is no verdict
        message = bounded(utf8_safe(_error_message(report)), MESSAGE_LIMIT, "message", utf8=True, lang=lang)
        return {"version": 3, "status": "error", "message": message, "tests": tests}
    return {"version": 3, "status": "pass" if report.lab_passed else "fail", "tests": tests}


def render(report: Report) -> str:
    return inert_json(json.dumps(to_dict(report), indent=2, ensure_ascii=False)) + "\n"
