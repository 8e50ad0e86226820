"""Messages a new learner misread (issue 16): time on the virtual clock, a crash quoted once, Persian
paths and labels."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from retrylab import bidi, i18n
from retrylab.fixtures.backoff_dlq import corpus
from retrylab.grading import grade, quote_once
from retrylab.reporters import text
from retrylab.results import StepResult

ENTRIES = {e.id: e for e in corpus.entries()}
CHECK_LOCALES = Path(__file__).resolve().parents[1] / "checks" / "backoff_dlq" / "locales"
TIME_MESSAGES = [("step7", "first_seen_reset"), ("step7", "first_seen_early"),
                 ("advanced_msg", "backoff-applied", "too_long"), ("advanced_msg", "backoff-applied", "same_wait"),
                 ("advanced_msg", "non-blocking", "held_up")]


@pytest.mark.parametrize("lang", i18n.LANGUAGES)
def test_time_based_messages_say_the_clock_is_virtual(lang):
    catalog = tomllib.loads((CHECK_LOCALES / f"{lang}.toml").read_text(encoding="utf-8"))
    for path in TIME_MESSAGES:
        template = catalog
        for part in path:
            template = template[part]
        assert "process(msg)" in template and "time.sleep" in template, (lang, path)


def test_a_reset_first_seen_at_is_explained_with_the_virtual_clock(tmp_path):
    report = grade(ENTRIES["wrong/dlq-first-seen-at-reset"].materialize(tmp_path / "s"), steps=(7,))
    [step7] = report.lab_results
    assert step7.status == "fail" and "virtual clock" in step7.message


def test_a_first_seen_at_from_lua_time_is_said_to_come_from_another_clock(tmp_path):
    # redis.call('TIME') in a script is the server's real time, days behind the run's clock
    report = grade(ENTRIES["wrong/first-seen-from-lua-time"].materialize(tmp_path / "s"), steps=(7,))
    [step7] = report.lab_results
    assert step7.status == "fail" and "a clock other than the grading's" in step7.message, step7.message


def _result(number, message):
    return StepResult(name=f"s{number}", title="t", status="fail", number=number, message=message)


def test_a_long_quote_repeated_by_later_steps_is_shown_once():
    crash = "\n".join(f"    line {n} of a traceback that is long enough to matter" for n in range(6))
    short = "    one short line"
    results = quote_once((_result(1, f"worker.py exited with status 1:\n{crash}\nHint: a"),
                          _result(2, f"other words. worker.py exited with status 1:\n{crash}\nHint: b"),
                          _result(6, f"x:\n{short}\nHint: c"), _result(7, f"y:\n{short}\nHint: d")))
    assert crash in results[0].message
    assert results[1].message == ("other words. worker.py exited with status 1:\n"
                                  "    (the same output as quoted under step 1 above)\nHint: b")
    assert short in results[2].message and short in results[3].message   # short quotes stay


def test_a_crashing_workers_traceback_appears_once_in_the_report(tmp_path):
    report = grade(ENTRIES["wrong/worker-syntax-error"].materialize(tmp_path / "s"))
    rendered = text.render(report)
    assert len(re.findall(r"SyntaxError", rendered)) == 1, rendered
    assert rendered.count("the same output as quoted under step 1 above") >= 3


@pytest.mark.parametrize("path", ["../subs/alice", "./alice", ".hidden/alice", "alice."])
def test_a_persian_path_is_isolated_whole(path):
    line = i18n.label("report.submission", "fa", path=path, backend="fake")
    assert f"{bidi.FSI}{path}{bidi.PDI}" in line and not bidi.bidi_problems(line)
    assert "backend" not in line   # translated, as in zh and ru
