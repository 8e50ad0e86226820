"""An exercise's check modules, conftest and fixture plugins are each loaded once, under one name, and
a grading puts nothing on sys.path (no top-level `checks` package beside `retrylab.checks`)."""
from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

from retrylab import exercise as exercises
from retrylab import plugin
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE
from retrylab.grading import grade


def _names_of(path: Path) -> list[str]:
    return [name for name, module in list(sys.modules.items())
            if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path.resolve()]


def test_a_grading_loads_each_module_of_the_exercise_once_and_leaves_sys_path_alone():
    before = list(sys.path)
    grade(REFERENCE, steps=(3,))
    grade(REFERENCE, steps=(3,))   # a second grading in the same process reuses them
    folder = exercises.get("backoff-dlq").folder
    assert sys.path == before
    assert len(_names_of(folder / "conftest.py")) == 1
    assert _names_of(folder / "runs.py") == ["retrylab.checks.backoff_dlq.runs"]
    # the modules other modules import are loaded by their package names only; pytest loads the
    # check modules themselves by path (importlib mode), under the names it derives from the path
    shared = sorted(p.name for p in folder.glob("*.py") if not p.name.startswith(("test_", "conftest", "__init__")))
    for name in shared:
        assert _names_of(folder / name) in ([f"retrylab.checks.backoff_dlq.{name[:-3]}"], []), name


def test_no_check_fails_by_a_bare_assert():
    # gradings run pytest with --assert=plain (grading.pytest_args): a check says what is wrong by raising
    # CheckFailed with the learner's message; a bare assert would give neither a message nor a verdict
    # (the plugin and the brokers' fixture plugins run under the same setting)
    harness = Path(plugin.__file__).parent
    modules = [*exercises.CHECKS_DIR.rglob("*.py"), harness / "plugin.py", *harness.glob("brokers/*/fixtures.py")]
    found = []
    for module in sorted(modules):
        tree = ast.parse(module.read_bytes(), filename=str(module))
        found += [f"{module}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    assert len(modules) > 30 and not found, found


def test_a_grading_takes_no_pytest_settings_from_the_environment(monkeypatch):
    # what a CI job sets for its own tests: xdist's -n (not loaded in a grading: a usage error), warnings as
    # errors, a keyword that selects no step, a plugin module that does not exist, pytest's debug trace
    monkeypatch.setenv("PYTEST_ADDOPTS", "-n 2 -W error -k nothing_matches")
    monkeypatch.setenv("PYTEST_PLUGINS", "retrylab_no_such_plugin")
    monkeypatch.setenv("PYTEST_DEBUG", "1")
    report = grade(REFERENCE, steps=(3,))
    assert [r.status for r in report.results if r.number == 3] == ["pass"], report.results
    assert os.environ["PYTEST_ADDOPTS"] == "-n 2 -W error -k nothing_matches"
    assert os.environ["PYTEST_PLUGINS"] == "retrylab_no_such_plugin"
