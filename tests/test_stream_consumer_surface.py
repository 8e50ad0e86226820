"""stream-consumer through the `retrylab` command, as graders and learners call it: the reference graded on
the fake backend in every report format and every language, `explain`, `grade-batch` over two submissions,
and `watch`'s choice of the steps to re-check first."""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from junitparser import Failure, JUnitXml

from retrylab import exercise as exercises
from retrylab import i18n
from retrylab.commands.watch import Watcher
from retrylab.fixtures.stream_consumer.corpus import REFERENCE

EXERCISE = exercises.get("stream-consumer")
STEPS = [step.number for step in EXERCISE.steps]
SCHEMAS = Path(__file__).parent / "schemas"
SCRIPTS = {"zh": re.compile(r"[\u4e00-\u9fff]"), "ru": re.compile(r"[\u0400-\u04ff]"),
           "fa": re.compile(r"[\u0600-\u06ff]")}
# each language graded once, each in another format: every format and every language goes through the CLI
GRADINGS = {"en": "text", "ru": "exercism", "fa": "gradescope", "zh": "junit"}


def retrylab(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrylab", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "LANGUAGE": "", "LC_ALL": "", "LANG": "C.UTF-8"})


def title(number: int, lang: str) -> str:
    return i18n.step_text(EXERCISE, EXERCISE.step(number), "title", lang)


@pytest.fixture(scope="module")
def graded() -> dict[str, subprocess.CompletedProcess]:
    return {lang: retrylab("check", "--exercise", "stream-consumer", str(REFERENCE), "--format", fmt, "--lang", lang)
            for lang, fmt in GRADINGS.items()}


def test_the_reference_passes_in_the_text_report(graded):
    done = graded["en"]
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "stream-consumer" in lines[0]
    for number in STEPS:
        assert f"PASS  step {number}: {title(number, 'en')}" in lines, done.stdout
    assert f"{len(STEPS)}/{len(STEPS)} steps pass" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_exercism_gives_each_step_its_task_id_in_russian(graded):
    done = graded["ru"]
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(done.stdout)
    jsonschema.validate(results, json.loads((SCHEMAS / "exercism-results-v3.schema.json").read_text(encoding="utf-8")),
                        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    assert results["version"] == 3 and results["status"] == "pass"
    assert [t["task_id"] for t in results["tests"]] == STEPS
    for test, number in zip(results["tests"], STEPS):
        assert test["status"] == "pass" and title(number, "ru") in test["name"]
        assert SCRIPTS["ru"].search(test["name"])


def test_gradescope_scores_every_step_in_persian(graded):
    done = graded["fa"]
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(done.stdout)
    jsonschema.validate(results, json.loads((SCHEMAS / "gradescope-results.schema.json").read_text(encoding="utf-8")))
    tests = results["tests"]
    assert [t["number"] for t in tests] == [str(n) for n in STEPS]
    assert all(t["status"] == "passed" and t["score"] == t["max_score"] > 0 for t in tests)
    assert results["score"] == pytest.approx(sum(t["max_score"] for t in tests))
    assert all(SCRIPTS["fa"].search(t["name"]) for t in tests)


def test_junit_has_one_passing_testcase_per_step_in_chinese(graded):
    done = graded["zh"]
    assert done.returncode == 0, done.stdout + done.stderr
    xml = JUnitXml.fromstring(done.stdout.encode("utf-8"))
    cases = [case for suite in xml for case in suite]
    assert len(cases) == len(STEPS)
    assert not any(isinstance(r, Failure) for case in cases for r in case.result)
    for case, number in zip(cases, STEPS):
        assert title(number, "zh") in case.name and SCRIPTS["zh"].search(case.name)


@pytest.mark.parametrize("lang", i18n.LANGUAGES)
def test_a_failing_step_speaks_the_language_with_its_hint(lang, tmp_path):
    """An empty directory: consumer.py is missing, said in the language, with the step's hint."""
    done = retrylab("check", "--exercise", "stream-consumer", str(tmp_path), "--step", "1", "--format", "exercism",
                    "--lang", lang)
    assert done.returncode == 1, done.stderr
    test = json.loads(done.stdout)["tests"][0]
    assert test["task_id"] == 1 and test["status"] == "fail"
    assert "consumer.py" in test["message"]
    assert i18n.step_text(EXERCISE, EXERCISE.step(1), "hint", lang) in test["message"]
    if lang != "en":
        assert SCRIPTS[lang].search(test["message"].splitlines()[0]), test["message"]
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("lang", i18n.LANGUAGES)
@pytest.mark.parametrize("number", STEPS)
def test_explain_says_each_steps_goal_formulas_hint_and_files(number, lang):
    done = retrylab("explain", "--exercise", "stream-consumer", str(number), "--lang", lang)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    step = EXERCISE.step(number)
    catalog = i18n.exercise_catalog(EXERCISE)
    for field in ("title", "goal", "hint"):
        assert catalog.text(f"steps.{step.slug}.{field}", lang) in done.stdout
    for name in step.formulas:
        assert EXERCISE.formulas[name] in done.stdout and catalog.text(f"formulas.{name}", lang) in done.stdout
    for name in step.files:
        assert name in done.stdout
    if lang != "en":
        assert SCRIPTS[lang].search(done.stdout)


def test_explain_without_a_step_lists_the_six():
    done = retrylab("explain", "--exercise", "stream-consumer", "--lang", "ru")
    assert done.returncode == 0
    for number in STEPS:
        assert title(number, "ru") in done.stdout
    assert i18n.exercise_catalog(EXERCISE).text("title", "ru") in done.stdout


def test_grade_batch_over_the_reference_and_an_empty_directory(tmp_path):
    submissions = tmp_path / "submissions"
    shutil.copytree(REFERENCE, submissions / "reference", ignore=shutil.ignore_patterns("__pycache__"))
    (submissions / "empty").mkdir()
    out = tmp_path / "gradebook.csv"
    done = retrylab("grade-batch", "--exercise", "stream-consumer", str(submissions), "--jobs", "2", "--out", str(out),
                    timeout=300)
    assert done.returncode == 0, done.stderr
    with out.open(newline="", encoding="utf-8") as f:
        rows = {row["id"]: row for row in csv.DictReader(f)}
    columns = [f"step{step.number}_{step.slug}" for step in EXERCISE.steps]
    assert [rows["reference"][c] for c in columns] == ["pass"] * len(STEPS), rows["reference"]
    assert [rows["empty"][c] for c in columns] == ["fail"] * len(STEPS), rows["empty"]
    assert rows["reference"]["status"] == "pass" and float(rows["reference"]["score"]) == pytest.approx(1.0)
    assert rows["empty"]["status"] == "fail" and float(rows["empty"]["score"]) == 0.0


@pytest.mark.parametrize("changed, first", [
    (["consumer.py"], STEPS),              # every step runs the consumer
    (["lag.py"], [5]),
    (["producer.py"], [6]),
    (["notes.md"], []),
])
def test_watch_rechecks_first_the_steps_that_read_a_changed_file(changed, first):
    args = argparse.Namespace(directory=Path("."), backend="fake", clear="never", exercise=EXERCISE.id)
    with open(os.devnull, "w") as out:
        got_first, rest = Watcher(args, EXERCISE, "en", out=out).order(changed)
    assert got_first == first
    assert sorted(got_first + rest) == STEPS
