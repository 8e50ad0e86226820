"""A failed check's report is its message: pytest formats no traceback for a verdict (it would be thrown away)."""
from __future__ import annotations

import pytest
from _pytest.nodes import Node

from retrylab import plugin
from retrylab.grading import grade
from retrylab.verdict import CannotJudge, CheckFailed


def test_failed_steps_say_their_message_without_pytest_formatting_a_traceback(tmp_path, monkeypatch):
    formatted = []
    original = Node._repr_failure_py

    def counted(self, excinfo, style=None):
        formatted.append((self.nodeid, type(excinfo.value).__name__))
        return original(self, excinfo, style)

    monkeypatch.setattr(Node, "_repr_failure_py", counted)
    (tmp_path / "submission").mkdir()
    report = grade(tmp_path / "submission", backend="fake")
    assert [r.status for r in report.results] == ["fail"] * len(report.results)   # an empty submission meets nothing
    assert formatted == []
    for step in report.results:
        assert "is missing from your submission" in step.message, step.message
        assert "Traceback" not in step.message and "def test_" not in step.message


@pytest.mark.parametrize("error", [CheckFailed, CannotJudge])
def test_an_empty_message_is_left_to_pytest_which_would_read_an_empty_text_as_no_failure(error):
    def check():
        raise error("")
    call = pytest.CallInfo.from_call(check, "call")
    assert plugin.pytest_runtest_makereport_without_traceback(None, call) is None
