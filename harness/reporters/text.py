"""The human report: one line per step, the failure detail under it, and a tally.

Labels are in the report's language (the checks wrote titles and messages in it already). Every
line is kept free of unbalanced bidi controls, so a Persian report stays readable in a terminal, and
of characters a terminal would act on (ESC, CR, backspace, bidi overrides: `bounds.neutral`), so what
a learner's script printed cannot repaint the verdict.
"""
from __future__ import annotations

from retrylab import bidi, i18n
from retrylab.reporters.bounds import language, neutral
from retrylab.reporters.github import inert_text
from retrylab.results import Report, StepResult

_STATUSES = ("pass", "fail", "error")


def _line(result: StepResult, lang: str) -> str:
    marks = {status: i18n.label(f"report.{status}", lang) for status in _STATUSES}
    column = max(map(bidi.width, marks.values()))
    label = i18n.label("report.step", lang, number=result.number) if not result.advanced else result.name
    return f"{bidi.pad(marks[result.status], column)} {label}: {result.title}"


def _detail(result: StepResult) -> list[str]:
    if result.passed or not result.message:
        return []
    # split at line feeds only, once what acts is escaped: splitlines() also broke at a learner's lone CR, form
    # feed, NEL or U+2028, and the next "line" could read "PASS  step 1: ..." under the real verdict
    message = neutral(result.message)
    parts = message.split("\n")
    return ["      " + bidi.balance(part) for part in (parts[:-1] if message.endswith("\n") else parts)]


def render(report: Report) -> str:
    lang = language(report)
    lines = [i18n.label("report.header", lang, version=report.harness_version, exercise=report.exercise_id,
                        title=report.exercise_title),
             i18n.label("report.submission", lang, path=report.submission, backend=report.backend), ""]
    for result in report.lab_results:
        lines.append(_line(result, lang))
        lines.extend(_detail(result))
    if report.advanced_results:
        lines += ["", i18n.label("report.advanced_heading", lang)]
        for result in report.advanced_results:
            lines.append(_line(result, lang))
            lines.extend(_detail(result))
    passed = sum(r.passed for r in report.lab_results)
    lines += ["", i18n.label("report.tally", lang, passed=passed, total=len(report.lab_results),
                             seconds=report.seconds)]
    if report.harness_error:
        lines.append(i18n.label("report.could_not_grade", lang, error=report.harness_error))
    lines.extend(report.notes)
    # Learner text (quoted output, data, file names) is shown, never obeyed: by the terminal (an ESC
    # sequence or a CR repainting a verdict) nor, on stdout in a GitHub job, by the runner (a quoted
    # `::stop-commands::` line)
    return inert_text("\n".join(bidi.balance(line) for line in neutral("\n".join(lines)).split("\n"))) + "\n"
