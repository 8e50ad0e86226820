"""Gradescope autograder results.json.

https://gradescope-autograders.readthedocs.io/en/latest/specs/ - top level `score`,
`execution_time` (seconds), `output` (shown to the student for the whole submission) and `tests`,
each with `name`, `number`, `score`, `max_score`, `status` (passed | failed), `output` and
`visibility` (hidden | after_due_date | after_published | visible).

Points: a lab step is worth its `weight` from exercise.toml (all or nothing); an advanced check is
worth 0 (max_score 0: it shows, passed or failed, without moving the grade). A step the harness
could not judge is failed with 0 points and says so: Gradescope has no "error" status, and the top
level output tells the student the grading was incomplete. Top-level `score` is the sum of the tests'.
Every text a student reads (names, outputs, the summary) is in the report's language.
"""
from __future__ import annotations

import json
import math

from retrylab import i18n
from retrylab.reporters.bounds import bounded, language, utf8_safe
from retrylab.reporters.exercism import display_name, in_step_order
from retrylab.reporters.github import inert_json
from retrylab.results import Report, StepResult

MESSAGE_LIMIT = 20000   # characters of a test's failure message (check messages are far shorter)
OUTPUT_LIMIT = 5000     # characters of what the learner's scripts printed, per test
VISIBILITY = "visible"  # the learner needs the failure message to fix the step


def _points(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 4)


def _number(result: StepResult, advanced_index: int) -> str:
    return str(result.number) if not result.advanced else f"A{advanced_index}"


def _output(result: StepResult, lang: str) -> str:
    parts = []
    if result.status == "error":
        parts.append(i18n.label("gradescope.not_judged", lang))
    if result.message and not result.passed:
        parts.append(bounded(utf8_safe(result.message), MESSAGE_LIMIT, "message", lang=lang))
    if result.output:
        printed = bounded(utf8_safe(result.output), OUTPUT_LIMIT, "output", lang=lang)
        parts.append(i18n.label("gradescope.printed", lang) + "\n" + printed)
    if result.advanced:
        parts.append(i18n.label("gradescope.advanced", lang))
    return "\n\n".join(parts)


def _test(result: StepResult, advanced_index: int, lang: str) -> dict:
    max_score = 0.0 if result.advanced else max(float(result.weight), 0.0)
    return {
        "name": utf8_safe(display_name(result, lang)),
        "number": _number(result, advanced_index),
        "score": _points(max_score if result.passed else 0.0),
        "max_score": _points(max_score),
        "status": "passed" if result.passed else "failed",
        "output": _output(result, lang),
        "visibility": VISIBILITY,
    }


def _summary(report: Report, score: float, possible: float, lang: str) -> str:
    lab = report.lab_results
    lines = [i18n.label("gradescope.summary", lang, title=report.exercise_title, passed=sum(r.passed for r in lab),
                        total=len(lab), score=_points(score), possible=_points(possible))]
    advanced = report.advanced_results
    if advanced:
        lines.append(i18n.label("gradescope.summary_advanced", lang, passed=sum(r.passed for r in advanced),
                                total=len(advanced)))
    if report.harness_error or any(r.status == "error" for r in report.results):
        reason = report.harness_error or i18n.label("gradescope.a_step_not_judged", lang)
        lines.append(i18n.label("gradescope.incomplete", lang, reason=utf8_safe(reason)))
    return "\n".join(lines)


def to_dict(report: Report) -> dict:
    lang = language(report)
    tests, advanced_index = [], 0
    for result in in_step_order(report.results):
        advanced_index += result.advanced
        tests.append(_test(result, advanced_index, lang))
    score = sum(t["score"] for t in tests)
    possible = sum(t["max_score"] for t in tests)
    return {
        "score": _points(score),
        "execution_time": math.ceil(max(report.seconds, 0.0)),
        "output": _summary(report, score, possible, lang),
        "tests": tests,
    }


def render(report: Report) -> str:
    return inert_json(json.dumps(to_dict(report), indent=2, ensure_ascii=False)) + "\n"
