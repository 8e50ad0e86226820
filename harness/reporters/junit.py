"""JUnit XML, as CI systems read it (Jenkins, GitLab, GitHub test reporters, junitparser).

    <testsuites>
      <testsuite name="EXERCISE-ID">            one <testcase> per lab step, in step order
      <testsuite name="EXERCISE-ID advanced">   advanced checks, reported apart (only if any)

A failed step is a <failure> whose message attribute is the message's first line and whose text is
the whole message; a step the harness could not judge is an <error>; what the learner's scripts
printed is the testcase's <system-out>. When nothing could be graded at all, one testcase named
`retrylab` carries the harness's reason as an <error>, so no CI mistakes an empty report for a pass.

Text is made XML-safe: characters XML 1.0 cannot hold (NUL, ESC of ANSI colours, ...) are written
as `\\xNN`, carriage returns become line feeds, and every value is bounded. Test names and the texts
the reporter adds are in the report's language; suite names, classnames and properties are not.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from retrylab import i18n
from retrylab.reporters.bounds import bounded, default_message, language, utf8_safe
from retrylab.reporters.exercism import display_name, in_step_order
from retrylab.reporters.github import inert_xml
from retrylab.results import Report, StepResult

MESSAGE_LIMIT = 65535   # characters of a failure's text
OUTPUT_LIMIT = 65535    # characters of <system-out>
ATTRIBUTE_LIMIT = 1000  # characters of a failure's message attribute (its first line)

_NOT_XML = re.compile("[^\t\n\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    text = utf8_safe(text).replace("\r\n", "\n").replace("\r", "\n")
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)


def _seconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}"


def _first_line(text: str, lang: str) -> str:
    line = next((part for part in text.splitlines() if part.strip()), "")
    return bounded(line, ATTRIBUTE_LIMIT, "message", lang=lang)


def _testcase(parent: ET.Element, classname: str, result: StepResult, lang: str) -> None:
    case = ET.SubElement(parent, "testcase", classname=classname, name=xml_text(display_name(result, lang)),
                         time=_seconds(result.seconds))
    if not result.passed:
        message = xml_text(result.message or default_message(result, lang))
        tag = "error" if result.status == "error" else "failure"
        problem = ET.SubElement(case, tag, message=_first_line(message, lang), type=result.status)
        problem.text = bounded(message, MESSAGE_LIMIT, "message", lang=lang)
    if result.output:
        ET.SubElement(case, "system-out").text = bounded(xml_text(result.output), OUTPUT_LIMIT, "output", lang=lang)


def _suite(root: ET.Element, name: str, results: tuple[StepResult, ...], report: Report) -> ET.Element:
    suite = ET.SubElement(root, "testsuite", name=name, tests=str(len(results)),
                          failures=str(sum(r.status == "fail" for r in results)),
                          errors=str(sum(r.status == "error" for r in results)), skipped="0",
                          time=_seconds(sum(r.seconds for r in results)))
    properties = ET.SubElement(suite, "properties")
    for key, value in (("submission", report.submission), ("backend", report.backend),
                       ("retrylab_version", report.harness_version)):
        ET.SubElement(properties, "property", name=key, value=xml_text(value))
    if report.harness_error:
        ET.SubElement(properties, "property", name="harness_error", value=xml_text(report.harness_error))
    return suite


def to_element(report: Report) -> ET.Element:
    lang = language(report)
    root = ET.Element("testsuites", name=f"retrylab {report.exercise_id}")
    lab, advanced = report.lab_results, report.advanced_results
    suite = _suite(root, report.exercise_id, lab, report)
    for result in in_step_order(lab):
        _testcase(suite, f"retrylab.{report.exercise_id}", result, lang)
    if not lab:
        # Nothing was graded: an empty suite would read as success to most CI systems.
        reason = xml_text(report.harness_error or i18n.label("formats.nothing_ran", lang))
        case = ET.SubElement(suite, "testcase", classname=f"retrylab.{report.exercise_id}", name="retrylab",
                             time="0.000")
        ET.SubElement(case, "error", message=_first_line(reason, lang), type="error").text = reason
        suite.set("tests", "1")
        suite.set("errors", "1")
    if advanced:
        adv_suite = _suite(root, f"{report.exercise_id} advanced", advanced, report)
        for result in advanced:
            _testcase(adv_suite, f"retrylab.{report.exercise_id}.advanced", result, lang)
    suites = list(root)
    for key in ("tests", "failures", "errors"):
        root.set(key, str(sum(int(s.get(key)) for s in suites)))
    root.set("time", _seconds(report.seconds))
    return root


def render(report: Report) -> str:
    root = to_element(report)
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    return inert_xml('<?xml version="1.0" encoding="UTF-8"?>\n' + body) + "\n"
