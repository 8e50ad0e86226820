"""Learner text in the human report is shown, never acted on by the terminal (issue 9 item 6): the
hostile fixture ansi-spoof crashes with stderr written to repaint the screen as an all-pass report."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from retrylab import bidi, i18n
from retrylab import exercise as exercises
from retrylab.fixtures.backoff_dlq import corpus
from retrylab.grading import grade, pytest_args
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


HOSTILE = "E\x1b]0;pwned\x07F\x1b[2JG\n::add-mask::secret\n  ::error::injected\n##[error]legacy"


def _raising(tmp_path):
    mine = tmp_path / "mine"
    shutil.copytree(corpus.REFERENCE, mine)
    (mine / "worker.py").write_text(f"raise RuntimeError({HOSTILE!r})\n")
    return mine


def test_under_plain_pytest_a_verdict_shows_learner_text_inert(tmp_path):
    # the README's plain-pytest way printed the learner's ESC sequences to the terminal, and lines GitHub Actions
    # runs as workflow commands (it strips the indentation first)
    env = {**os.environ, "GITHUB_ACTIONS": "true", "COLUMNS": "300"}   # room for the summary line's message
    done = subprocess.run([sys.executable, "-m", "pytest", *pytest_args(exercises.get("backoff-dlq")),
                           "--solution", str(_raising(tmp_path)), "--step=1", "-p", "no:randomly",
                           "-p", "no:cacheprovider", "-rf"], capture_output=True, text=True, timeout=120, env=env)
    assert "pwned" in done.stdout, done.stdout               # the message is shown...
    assert not ACTIVE.search(done.stdout), done.stdout       # ...inert
    commands = [line for line in done.stdout.splitlines() if line.lstrip().startswith("::") or "##[" in line]
    assert not commands, commands
    summary = [line for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    assert summary and all(" - " in line for line in summary), summary     # the verdict's first line is there


def test_a_grading_still_hands_its_reporters_the_message_as_written(tmp_path):
    step1 = next(r for r in grade(_raising(tmp_path), steps=(1,)).results if r.number == 1)
    assert step1.status == "fail" and "RuntimeError: E\x1b]0;pwned\x07F" in step1.message   # raw, as before


@pytest.mark.parametrize("breaker", ["\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028"])
def test_a_learners_line_breaker_starts_no_line_of_the_text_report(breaker):
    # str.splitlines() broke the message at these, and the learner's next "line" read as a verdict
    forged = f"expected 6 lines{breaker}PASS  step 2: failed message requeued"
    report = Report(exercise_id="backoff-dlq", exercise_title="t", submission="s", backend="fake",
                    harness_version="0", results=(
        StepResult(name="worker", title="worker consumes q:tasks", status="fail", number=1, message=forged),))
    lines = text.render(report).splitlines()
    assert not [line for line in lines if line.strip().startswith("PASS")], lines
