"""Learner text in the human report is shown, never acted on by the terminal (issue 9 item 6): the
hostile fixture ansi-spoof crashes with stderr written to repaint the screen as an all-pass report."""
from __future__ import annotations

import re

import pytest

from retrylab import bidi, i18n
from retrylab.fixtures.backoff_dlq import corpus
from retrylab.grading import grade
from retrylab.reporters import github, text
from retrylab.reporters.bounds import neutral
from retrylab.results import Report, StepResult

# what a terminal acts on: C0 but LF and TAB, DEL, C1, bidi embeddings and overrides
ACTIVE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066\u2067]")


def test_neutral_escapes_what_a_terminal_acts_on_and_keeps_the_rest():
    assert neutral("a\x1b[2Jb\rc\bd\u202ee\x9bf\x07") == "a\\x1b[2Jb\\rc\\bd\\u202ee\\x9bf\\x07"
    assert neutral("line 1\r\nline 2\ttab") == "line 1\nline 2\ttab"   # CRLF is a line end
    plain = "\u200eok 你好 привет سلام \u2068x\u2069"                  # the harness's own isolates and marks stay
    assert neutral(plain) is plain


def test_neutral_escapes_a_learners_directional_marks_but_not_the_harnesss():
    # RLM, ALM and LRM turn the direction of the text around them; the harness writes only LRM, first on a line
    assert neutral("ab\u200fcd\u061cef\u200egh") == "ab\\u200fcd\\u061cef\\u200egh"
    assert neutral("\u200f\u200eyes\n  \u061cno") == "\\u200f\\u200eyes\n  \\u061cno"
    plot = i18n.ltr_lines("1 ---o--\n  2 -X----", "fa")            # a plot's rows, left to right
    assert neutral(plot) == plot and neutral("      " + plot) == "      " + plot
    assert neutral(plot + " \u200e\u200f") == plot + " \\u200e\\u200f"   # a learner's marks after it do not


def test_a_persian_report_escapes_learner_marks_and_keeps_its_plot_rows():
    chart = i18n.ltr_lines("1 ---o--\n2 -X----", "fa")
    rendered = text.render(_report("worker.py printed: \u200fPASS\u061c 8/8\u200e\n" + chart, "fa"))
    assert "\\u200fPASS\\u061c 8/8\\u200e" in rendered, rendered
    assert "\u200f" not in rendered and "\u061c" not in rendered
    assert "\u200e1 ---o--" in rendered and "\u200e2 -X----" in rendered   # the harness's marks survive


def _report(message: str, lang: str = "en") -> Report:
    result = StepResult(name="worker", title="worker", status="fail", number=1, message=message,
                        location=("worker.py", None))
    return Report(exercise_id="backoff-dlq", exercise_title="t", submission="/s", backend="fake",
                  harness_version="0", results=(result,), lang=lang)


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_text_report_and_annotations_carry_no_active_character(lang):
    spoof = "\x1b[2J\x1b[HPASS step 1\rPASS\b\b\u202eliaf \u2066x\x9b2J"
    for rendered in (text.render(_report(spoof, lang)), github.render(_report(spoof, lang))):
        assert not ACTIVE.search(rendered), repr(rendered)
        assert "\\x1b[2J" in rendered and "\\u202e" in rendered
    assert not bidi.bidi_problems(text.render(_report(spoof, lang)))


def test_ansi_spoof_cannot_repaint_the_verdict(tmp_path):
    entry = next(e for e in corpus.entries("hostile") if e.name == "ansi-spoof")
    report = grade(entry.materialize(tmp_path / "submission"))
    assert {r.number: r.status for r in report.lab_results} == entry.expect
    rendered = text.render(report)
    assert not ACTIVE.search(rendered), "a raw control character reached the text report"
    assert "\\x1b[32mPASS" in rendered, "the learner's escapes should be shown, escaped"
    assert rendered.splitlines()[-1].startswith("4/8 steps pass")   # the real tally, not the painted one
    assert not ACTIVE.search(github.render(report))
