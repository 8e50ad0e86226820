"""Every output format against its published field list, on hand-built reports and real runs.

Exercism and Gradescope results are validated with JSON Schemas written from their specs
(tests/schemas/); JUnit XML is read back with a real JUnit parser (junitparser); GitHub workflow
commands are read back the way the Actions runner reads them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from junitparser import Error, Failure, JUnitXml

from retrylab import exercise as exercises
from retrylab import i18n
from retrylab.checks.backoff_dlq.artifacts import parse_capped, parse_jitter, parse_schedule
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE
from retrylab.reporters import FORMATS, bounds, exercism, github, gradescope, junit
from retrylab.reporters.bounds import neutral
from retrylab.results import Report, StepResult

SCHEMAS = Path(__file__).parent / "schemas"
EXERCISM_SCHEMA = json.loads((SCHEMAS / "exercism-results-v3.schema.json").read_text(encoding="utf-8"))
GRADESCOPE_SCHEMA = json.loads((SCHEMAS / "gradescope-results.schema.json").read_text(encoding="utf-8"))
EXERCISE = exercises.get("backoff-dlq")

CHINESE = "第3行：等待时间应为 4 秒，而不是 5 秒。请检查指数退避公式。"
PERSIAN = "خط ۳ از schedule.txt: زمان انتظار باید ۴ ثانیه باشد، نه ۵ ثانیه."
NASTY = "\x1b[31mred\x1b[0m nul\x00 bell\x07 lone\udcff surrogate \r\ncrlf % 100%0A :: , =,"
INJECTION = "before\n::stop-commands::pwned\n  ::error file=x::fake\n##[error]legacy in a line ##[warning]"


def lab(number: int, status: str = "pass", message: str = "", output: str = "", **extra) -> StepResult:
    step = EXERCISE.step(number)
    return StepResult(name=step.slug, title=step.title, status=status, number=number, weight=step.weight,
                      message=message, output=output, seconds=0.25, **extra)


def advanced(slug: str, status: str, message: str = "") -> StepResult:
    return StepResult(name=f"advanced:{slug}", title=f"{slug} (optional)", status=status, message=message,
                      number=None, weight=0.0, seconds=0.5, kind=exercises.ADVANCED)


def report(results, harness_error: str = "") -> Report:
    return Report(exercise_id=EXERCISE.id, exercise_title=EXERCISE.title, submission="/subs/learner",
                  backend="fake", harness_version="0.1.0", results=tuple(results), seconds=3.2,
                  harness_error=harness_error)


ALL_PASS = report(lab(n, output=f"step {n} ok") for n in range(1, 9))
SOME_FAIL = report([
    lab(1), lab(2),
    lab(3, "fail", "line 3 of schedule.txt (attempt=2): wait is 5, expected 4\nHint: 1 s * 2**n",
        location=("schedule.txt", 3)),
    lab(4), lab(5),
    dataclasses.replace(lab(6, "fail", "q:tasks:dlq is empty\nHint: push to the DLQ", output="Traceback ...",
                            location=("worker.py", None)), weight=2.0),
    lab(7),
    lab(8, "error", "the harness failed while checking this step: RuntimeError: boom"),
])
HARNESS_ERROR = report([lab(n, "error", "no check ran for this step (a harness defect)") for n in range(1, 9)],
                       harness_error="redis-server is not installed")
NOTHING_RAN = report([], harness_error="a check module could not be loaded: SyntaxError")
HUGE = report([lab(1, "fail", ("长" * 40000) + "x" * 100000 + "\nHint: the end", output="o" * 1_000_000 + "END"),
               *(lab(n) for n in range(2, 9))])
ADVANCED = report([*(lab(n) for n in range(1, 9)), advanced("idempotency", "pass"),
                   advanced("poison-pill", "fail", "the poison message was retried forever")])
UNICODE = report([lab(1, "fail", f"{CHINESE}\n{PERSIAN}\n{NASTY}", output=f"{PERSIAN} {NASTY}"),
                  lab(2, "fail", INJECTION, output=INJECTION, location=("requeue.out", None)),
                  *(lab(n) for n in range(3, 9))])
REPORTS = {"all-pass": ALL_PASS, "some-fail": SOME_FAIL, "harness-error": HARNESS_ERROR,
           "nothing-ran": NOTHING_RAN, "huge": HUGE, "advanced": ADVANCED, "unicode": UNICODE}


def exercism_of(rep: Report) -> dict:
    return json.loads(exercism.render(rep))


def gradescope_of(rep: Report) -> dict:
    return json.loads(gradescope.render(rep))


# --------------------------------------------------------------------------------------------
# every report, every format: valid by the published field lists


@pytest.mark.parametrize("name", REPORTS)
def test_exercism_results_match_the_v3_schema(name):
    jsonschema.validate(exercism_of(REPORTS[name]), EXERCISM_SCHEMA,
                        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


@pytest.mark.parametrize("name", REPORTS)
def test_gradescope_results_match_the_schema_and_carry_the_issue_fields(name):
    data = gradescope_of(REPORTS[name])
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    assert {"score", "execution_time", "output", "tests"} <= set(data)
    for test in data["tests"]:
        assert set(test) == {"name", "number", "score", "max_score", "status", "output", "visibility"}


@pytest.mark.parametrize("name", REPORTS)
def test_junit_parses_with_one_testcase_per_check(name):
    rep = REPORTS[name]
    xml = JUnitXml.fromstring(junit.render(rep).encode("utf-8"))
    cases = [case for suite in xml for case in suite]
    assert len(cases) == (len(rep.results) or 1)
    for suite in xml:
        assert suite.tests == len(list(suite))
        assert suite.failures == sum(isinstance(r, Failure) for c in suite for r in c.result)
        assert suite.errors == sum(isinstance(r, Error) for c in suite for r in c.result)


@pytest.mark.parametrize("name", REPORTS)
def test_json_formats_are_utf8_and_keep_every_letter(name):
    for render in (exercism.render, gradescope.render):
        text = render(REPORTS[name])
        text.encode("utf-8")  # no lone surrogate survives
        assert text.endswith("}\n")


# --------------------------------------------------------------------------------------------
# Exercism


def test_exercism_all_pass():
    data = exercism_of(ALL_PASS)
    assert data["version"] == 3 and data["status"] == "pass" and "message" not in data
    assert [t["task_id"] for t in data["tests"]] == list(range(1, 9))
    assert [t["name"] for t in data["tests"]][:2] == ["step 1: worker consumes q:tasks",
                                                      "step 2: failed message requeued with attempts + 1"]
    assert all(t["status"] == "pass" and "message" not in t for t in data["tests"])
    assert data["tests"][4]["output"] == "step 5 ok"


def test_exercism_some_fail_keeps_messages_per_test_and_no_top_level_message():
    data = exercism_of(SOME_FAIL)
    assert data["status"] == "fail" and "message" not in data
    statuses = {t["task_id"]: t["status"] for t in data["tests"]}
    assert statuses == {1: "pass", 2: "pass", 3: "fail", 4: "pass", 5: "pass", 6: "fail", 7: "pass", 8: "error"}
    by_step = {t["task_id"]: t for t in data["tests"]}
    assert by_step[3]["message"] == SOME_FAIL.results[2].message
    assert by_step[8]["message"].startswith("the harness failed")


def test_exercism_error_only_when_nothing_ran_with_the_reason():
    data = exercism_of(HARNESS_ERROR)
    assert data["status"] == "error" and data["message"] == "redis-server is not installed"
    nothing = exercism_of(NOTHING_RAN)
    assert nothing["status"] == "error" and nothing["tests"] == []
    assert nothing["message"].startswith("a check module could not be loaded")
    # one step the harness could not judge, the others judged: the run is a fail, not an error
    partial = exercism_of(report([lab(1, "error", "boom"), *(lab(n) for n in range(2, 9))], "boom"))
    assert partial["status"] == "fail" and "message" not in partial
    # without a harness_error line, the steps' own reasons explain the error
    reasons = exercism_of(report([lab(n, "error", "backend went away") for n in (1, 2)]))
    assert reasons["status"] == "error" and reasons["message"] == "backend went away"


def test_exercism_tests_follow_the_step_order_with_advanced_checks_last():
    shuffled = report([ADVANCED.results[9], lab(5), lab(1), ADVANCED.results[8], lab(3)])
    assert [t["name"].split(":")[0] for t in exercism_of(shuffled)["tests"]] == [
        "step 1", "step 3", "step 5", "advanced", "advanced"]


def test_exercism_advanced_checks_have_no_task_id_and_do_not_fail_the_lab():
    data = exercism_of(ADVANCED)
    assert data["status"] == "pass"  # the lab's verdict; see the module docstring
    extra = data["tests"][8:]
    assert [t["name"] for t in extra] == ["advanced:idempotency: idempotency (optional)",
                                          "advanced:poison-pill: poison-pill (optional)"]
    assert all("task_id" not in t for t in extra)
    assert [t["status"] for t in extra] == ["pass", "fail"]
    assert extra[1]["message"] == "the poison message was retried forever"


def test_exercism_huge_message_and_output_are_cut_with_a_notice():
    test = exercism_of(HUGE)["tests"][0]
    original = HUGE.results[0]
    assert len(test["output"]) <= 500
    assert test["output"].startswith("ooo") and test["output"].endswith("END")
    assert re.search(r"\[\.\.\. \d+ characters of output omitted \.\.\.\]", test["output"])
    assert len(test["message"].encode("utf-8")) <= 65535  # bytes: the limit shrinks with multi-byte text
    assert test["message"].startswith("长长长") and test["message"].endswith("Hint: the end")
    omitted = int(re.search(r"\[\.\.\. (\d+) characters of message omitted", test["message"]).group(1))
    kept = len(test["message"]) - len(re.search(r"\n\[\.\.\. .*? \.\.\.\]\n", test["message"]).group())
    assert kept + omitted == len(original.message)


def test_exercism_output_limit_is_exact():
    fits, over = (exercism_of(report([lab(1, output="a" * n)]))["tests"][0]["output"] for n in (500, 501))
    assert fits == "a" * 500
    assert len(over) <= 500 and "omitted" in over


def test_exercism_unicode_round_trips_and_bad_characters_are_made_visible():
    test = exercism_of(UNICODE)["tests"][0]
    assert CHINESE in test["message"] and PERSIAN in test["message"]
    assert "\\udcff" in test["message"] and "\udcff" not in test["message"]
    assert test["message"].replace("\\udcff", "\udcff") == UNICODE.results[0].message


# --------------------------------------------------------------------------------------------
# Gradescope


def test_gradescope_scores_use_the_step_weights():
    data = gradescope_of(SOME_FAIL)
    by_number = {t["number"]: t for t in data["tests"]}
    assert by_number["6"]["max_score"] == 2 and by_number["6"]["score"] == 0
    assert by_number["3"]["status"] == "failed" and by_number["1"]["status"] == "passed"
    assert by_number["1"]["score"] == by_number["1"]["max_score"] == 1
    assert data["score"] == sum(t["score"] for t in data["tests"]) == 5
    assert sum(t["max_score"] for t in data["tests"]) == 9
    assert "line 3 of schedule.txt" in by_number["3"]["output"]
    assert "could not judge" in by_number["8"]["output"] and by_number["8"]["score"] == 0
    assert "5/8 lab steps pass" in data["output"] and "could not grade everything" in data["output"]
    assert all(t["visibility"] == "visible" for t in data["tests"])
    assert isinstance(data["execution_time"], int) and data["execution_time"] == 4


def test_gradescope_all_pass_scores_full_marks():
    data = gradescope_of(ALL_PASS)
    assert data["score"] == 8 and all(t["status"] == "passed" for t in data["tests"])
    assert [t["number"] for t in data["tests"]] == [str(n) for n in range(1, 9)]
    assert "could not grade" not in data["output"]


def test_gradescope_advanced_checks_carry_zero_points():
    data = gradescope_of(ADVANCED)
    extra = data["tests"][8:]
    assert [(t["score"], t["max_score"], t["status"]) for t in extra] == [(0, 0, "passed"), (0, 0, "failed")]
    assert [t["number"] for t in extra] == ["A1", "A2"]
    assert data["score"] == 8 and sum(t["max_score"] for t in data["tests"]) == 8
    assert "Advanced checks (no points): 1/2 pass" in data["output"]


def test_gradescope_harness_error_scores_zero_and_says_why():
    data = gradescope_of(HARNESS_ERROR)
    assert data["score"] == 0 and "redis-server is not installed" in data["output"]
    assert gradescope_of(NOTHING_RAN)["tests"] == []


def test_gradescope_huge_output_is_bounded_with_a_notice():
    test = gradescope_of(HUGE)["tests"][0]
    assert len(test["output"]) < gradescope.MESSAGE_LIMIT + gradescope.OUTPUT_LIMIT + 200
    assert test["output"].count("omitted ...]") == 2 and test["output"].endswith("END")


def test_gradescope_unicode():
    test = gradescope_of(UNICODE)["tests"][0]
    assert CHINESE in test["output"] and PERSIAN in test["output"]


# --------------------------------------------------------------------------------------------
# JUnit


def junit_cases(rep: Report) -> dict:
    xml = JUnitXml.fromstring(junit.render(rep).encode("utf-8"))
    return {case.name: (suite.name, case) for suite in xml for case in suite}


def test_junit_failure_text_is_the_message():
    cases = junit_cases(SOME_FAIL)
    suite, step3 = cases["step 3: exponential backoff schedule"]
    assert suite == "backoff-dlq"
    [failure] = step3.result
    assert isinstance(failure, Failure) and failure.text == SOME_FAIL.results[2].message
    assert failure.message == "line 3 of schedule.txt (attempt=2): wait is 5, expected 4"
    [error] = cases["step 8: explicit one-shot replay"][1].result
    assert isinstance(error, Error) and error.text.startswith("the harness failed")
    assert cases["step 6: gives up after 5 failures: DLQ"][1].system_out == "Traceback ..."
    assert cases["step 1: worker consumes q:tasks"][1].is_passed


def test_junit_advanced_checks_are_a_suite_apart():
    cases = junit_cases(ADVANCED)
    suite, case = cases["advanced:poison-pill: poison-pill (optional)"]
    assert suite == "backoff-dlq advanced" and isinstance(case.result[0], Failure)
    assert cases["advanced:idempotency: idempotency (optional)"][1].is_passed


def test_junit_nothing_ran_is_an_error_not_an_empty_pass():
    [(name, (_, case))] = junit_cases(NOTHING_RAN).items()
    assert name == "retrylab" and isinstance(case.result[0], Error)
    assert case.result[0].text == NOTHING_RAN.harness_error


def test_junit_huge_and_unicode_text():
    _, case = junit_cases(HUGE)["step 1: worker consumes q:tasks"]
    assert len(case.result[0].text) <= junit.MESSAGE_LIMIT and "omitted" in case.result[0].text
    assert len(case.system_out) <= junit.OUTPUT_LIMIT and case.system_out.endswith("END")
    _, case = junit_cases(UNICODE)["step 1: worker consumes q:tasks"]
    text = case.result[0].text
    assert CHINESE in text and PERSIAN in text
    # characters XML cannot hold are shown, not dropped; CR LF becomes LF
    assert "\\x1b[31mred\\x1b[0m nul\\x00 bell\\x07 lone\\udcff surrogate \ncrlf % 100%0A" in text


# --------------------------------------------------------------------------------------------
# learner text must not act as a workflow command when a report goes to stdout in a GitHub job


def runner_would_obey(line: str) -> bool:
    """The Actions runner: `::cmd` after leading whitespace, or a legacy `##[` anywhere in a line."""
    return line.lstrip().startswith("::") or "##[" in line


@pytest.mark.parametrize("fmt", ["exercism", "gradescope", "junit", "text"])
def test_reports_hold_no_workflow_command(fmt):
    rendered = FORMATS[fmt](UNICODE)
    assert not [line for line in re.split(r"\r\n|\r|\n", rendered) if runner_would_obey(line)]


def test_the_text_report_still_shows_the_quoted_lines():
    shown = FORMATS["text"](UNICODE).replace("\u2060", "")   # the word joiner is invisible
    for line in INJECTION.splitlines():
        assert line in shown


def test_neutralised_text_reads_back_unchanged():
    assert exercism_of(UNICODE)["tests"][1]["message"] == INJECTION
    assert gradescope_of(UNICODE)["tests"][1]["output"].startswith(INJECTION)
    _, case = junit_cases(UNICODE)["step 2: failed message requeued with attempts + 1"]
    assert case.result[0].text == INJECTION and case.system_out == INJECTION


# --------------------------------------------------------------------------------------------
# GitHub annotations

_UNESCAPE = {"%25": "%", "%0D": "\r", "%0A": "\n", "%3A": ":", "%2C": ","}


def unescape(text: str) -> str:
    return re.sub("%(?:25|0D|0A|3A|2C)", lambda m: _UNESCAPE[m.group()], text)


def parse_commands(text: str) -> list[tuple[str, dict, str]]:
    """Workflow commands as the runner reads them: (command, properties, message), unescaped."""
    parsed = []
    for line in text.splitlines():
        match = re.fullmatch(r"::(\w+)(?: ([^:]*))?::(.*)", line)
        assert match, line
        props = dict(p.split("=", 1) for p in match.group(2).split(",")) if match.group(2) else {}
        parsed.append((match.group(1), {k: unescape(v) for k, v in props.items()}, unescape(match.group(3))))
    return parsed


def test_escaping_follows_the_actions_toolkit():
    assert github.escape_data("50% done\r\nnext: a, b") == "50%25 done%0D%0Anext: a, b"
    assert github.escape_property("50% done\r\nnext: a, b") == "50%25 done%0D%0Anext%3A a%2C b"
    assert github.command("error", "x", file="a,b:c.txt", line=3, title="t: 1") == (
        "::error file=a%2Cb%3Ac.txt,line=3,title=t%3A 1::x\n")
    assert github.command("warning", "only a message") == "::warning::only a message\n"


def test_failed_steps_become_error_annotations_on_the_learners_file():
    commands = parse_commands(github.render(SOME_FAIL, "/ws/sub"))
    assert [c[0] for c in commands] == ["error", "error", "error"]
    kind, props, message = commands[0]
    assert props == {"file": "/ws/sub/schedule.txt", "line": "3",
                     "title": "retrylab step 3: exponential backoff schedule"}
    assert message == SOME_FAIL.results[2].message
    assert commands[1][1]["file"] == "/ws/sub/worker.py" and "line" not in commands[1][1]
    assert "file" not in commands[2][1] and commands[2][2].startswith("the harness failed")


def test_annotations_only_for_failures_and_warnings_for_advanced_checks():
    assert github.render(ALL_PASS) == ""
    [(kind, props, message)] = parse_commands(github.render(ADVANCED))
    assert kind == "warning" and props["title"] == "retrylab advanced:poison-pill: poison-pill (optional)"
    [*_, (kind, props, message)] = parse_commands(github.render(HARNESS_ERROR))
    assert kind == "error" and "file" not in props and message == "redis-server is not installed"


def test_annotation_messages_are_one_line_and_read_back_exactly():
    rendered = github.render(UNICODE, "/ws/sub")
    assert rendered.count("\n") == 2 and "\r" not in rendered
    first, second = parse_commands(rendered)
    # read back as shown: learner control characters escaped as in the text report
    assert first[2] == neutral(UNICODE.results[0].message).replace("\udcff", "\\udcff")
    assert second[2] == INJECTION and second[1]["file"] == "/ws/sub/requeue.out"


def test_huge_annotation_is_bounded():
    [(_, _, message)] = parse_commands(github.render(HUGE))
    assert len(message) <= github.MESSAGE_LIMIT and message.endswith("Hint: the end")


# --------------------------------------------------------------------------------------------
# bounds


@pytest.mark.parametrize("utf8", [False, True])
@pytest.mark.parametrize("limit", [60, 61, 200, 500])
def test_bounded_always_fits_and_keeps_both_ends(limit, utf8):
    for text in ("x" * 10_000, "长" * 10_000, "ab" * 3 + "长" * 5000 + "\U0001F600" * 3000 + "end"):
        out = bounds.bounded(text, limit, "output", utf8=utf8)
        size = len(out.encode("utf-8")) if utf8 else len(out)
        assert size <= limit and "omitted" in out
        assert out[0] == text[0] and out[-1] == text[-1]


def test_bounded_keeps_whole_lines_when_lines_are_short():
    text = "\n".join(f"line {i}" for i in range(1000))
    out = bounds.bounded(text, 200, "output")
    head, notice, tail = re.split(r"\n(\[\.\.\. \d+ characters of output omitted \.\.\.\])\n", out)
    assert head.startswith("line 0\nline 1\n") and tail.endswith("line 999")
    assert all(re.fullmatch(r"line \d+", part) for part in (head + "\n" + tail).splitlines())
    assert int(notice.split()[1]) == len(text) - len(head) - len(tail)


def test_bounded_leaves_short_text_alone_and_tiny_limits_cut():
    assert bounds.bounded("short", 5) == "short"
    assert bounds.bounded("abcdef", 3) == "abc"


# --------------------------------------------------------------------------------------------
# where a failure is: the parsers name the line, the checks pass it on


SCHEDULE = b"attempt=0 wait=1\nattempt=1 wait=2\n\nattempt=2 wait=5\nattempt=3 wait=8\nattempt=4 wait=16\nattempt=5 wait=32\n"


def test_parsers_report_the_line_of_the_problem():
    assert parse_schedule(SCHEDULE).line == 4  # the editor's line number (a blank line before it)
    assert parse_schedule(SCHEDULE.replace(b"wait=5", b"wait=4")).line is None  # ok
    assert parse_schedule(SCHEDULE + b"attempt=6 wait=64\n").line is None  # a count, no one line
    assert parse_schedule(None).line is None
    assert parse_jitter(b"1.5\n" * 3 + b"nine\n").line == 4
    assert parse_capped(b"1\n2\nattempt=2 wait=4\n").line == 3


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> Path:
    """The reference with schedule.txt wrong on line 3 and workflow commands in jitter.txt."""
    sub = tmp_path_factory.mktemp("broken") / "sub"
    shutil.copytree(REFERENCE, sub, ignore=shutil.ignore_patterns("__pycache__"))
    lines = (sub / "schedule.txt").read_text().splitlines()
    lines[2] = "attempt=2 wait=5"
    (sub / "schedule.txt").write_text("\n".join(lines) + "\n")
    with (sub / "jitter.txt").open("a") as f:
        f.write("::stop-commands::pwned\n##[error]legacy\n")
    return sub


def test_graded_failures_carry_their_location(broken):
    from retrylab.grading import grade
    rep = grade(broken, steps=(3, 4, 5))
    step3, step4, step5 = rep.results
    assert step3.status == "fail" and step3.location == ("schedule.txt", 3)
    assert step4.status == "fail" and step4.location == ("jitter.txt", 21)
    assert step5.passed and step5.location == ("capped.txt", None)  # the step's file, exercise.toml
    jsonschema.validate(exercism_of(rep), EXERCISM_SCHEMA)
    jsonschema.validate(gradescope_of(rep), GRADESCOPE_SCHEMA)


@pytest.fixture(scope="module")
def reference_report() -> Report:
    from retrylab.grading import grade
    return grade(REFERENCE)


def test_reference_run_in_every_format(reference_report):
    data = exercism_of(reference_report)
    jsonschema.validate(data, EXERCISM_SCHEMA)
    assert data["status"] == "pass" and [t["task_id"] for t in data["tests"] if "task_id" in t] == list(range(1, 9))
    assert len(data["tests"]) == 8 + len(EXERCISE.advanced)
    scored = gradescope_of(reference_report)
    jsonschema.validate(scored, GRADESCOPE_SCHEMA)
    assert scored["score"] == sum(s.weight for s in EXERCISE.steps)
    xml = JUnitXml.fromstring(junit.render(reference_report).encode("utf-8"))
    assert all(case.is_passed for suite in xml for case in suite if suite.name == EXERCISE.id)
    assert not [c for c in parse_commands(github.render(reference_report)) if c[0] == "error"]


def test_learner_output_is_reported_once_per_check(reference_report):
    # setup, call and teardown reports each copy the check's properties: read once, not thrice
    replay = reference_report.results[7]
    assert replay.output and all(replay.output.count(line) == 1 for line in set(replay.output.splitlines()))


# --------------------------------------------------------------------------------------------
# the command: annotations on stderr, only the report on stdout


def retrylab(*args: str, github_actions: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}
    if github_actions:
        env["GITHUB_ACTIONS"] = "true"
    return subprocess.run([sys.executable, "-m", "retrylab", *args], capture_output=True, text=True,
                          env=env, timeout=120)


PARSE_STDOUT = {"exercism": json.loads, "gradescope": json.loads,
                "junit": lambda text: JUnitXml.fromstring(text.encode("utf-8"))}


@pytest.mark.parametrize("fmt", sorted(PARSE_STDOUT))
def test_github_annotations_go_to_stderr_and_stdout_stays_parseable(broken, fmt):
    done = retrylab("check", str(broken), "--step", "3", "--step", "4", "--format", fmt, github_actions=True)
    assert done.returncode == 1, done.stderr
    PARSE_STDOUT[fmt](done.stdout)
    assert "::error" not in done.stdout
    annotations = [line for line in done.stderr.splitlines() if line.startswith("::")]
    commands = parse_commands("\n".join(annotations))
    assert [(c[1]["file"], c[1].get("line")) for c in commands] == [
        (str(broken.resolve() / "schedule.txt"), "3"), (str(broken.resolve() / "jitter.txt"), "21")]


def test_no_annotations_outside_github_actions(broken):
    done = retrylab("check", str(broken), "--step", "3", "--format", "exercism", github_actions=False)
    assert done.returncode == 1 and "::error" not in done.stderr
    assert json.loads(done.stdout)["tests"][0]["status"] == "fail"


def test_empty_directory_in_a_github_job(tmp_path):
    done = retrylab("check", str(tmp_path), "--format", "exercism", github_actions=True)
    data = json.loads(done.stdout)
    jsonschema.validate(data, EXERCISM_SCHEMA)
    assert data["status"] == "fail"
    commands = parse_commands("\n".join(line for line in done.stderr.splitlines() if line.startswith("::")))
    errors = [props for kind, props, _ in commands if kind == "error"]
    assert [props["title"].split(":")[0] for props in errors] == [f"retrylab step {n}" for n in range(1, 9)]
    assert {Path(props["file"]).name for props in errors} == {
        "worker.py", "requeue.out", "schedule.txt", "jitter.txt", "capped.txt", "replay.py"}
    # failed advanced checks are warnings: they do not change the lab's result
    assert [kind for kind, _, _ in commands[8:]] == ["warning"] * len(EXERCISE.advanced)


@pytest.mark.parametrize("lang", ["en", "ru", "zh", "fa"])
@pytest.mark.parametrize("limit, utf8", [(500, False), (5000, False), (65535, True)])
def test_a_cut_keeps_the_runs_own_notice_of_what_it_dropped(lang, limit, utf8):
    # the sandbox keeps 64 KiB of a run's output and says how much it dropped; every reporter then cut the
    # middle again, notice included, and said "271 characters omitted" of 10 MB
    dropped = i18n.label("run.not_shown", lang, count=10_000_000)
    text = "line\n" * 14_000 + dropped + "\n" + "line\n" * 14_000
    kept = bounds.bounded(text, limit, "output", utf8=utf8, lang=lang)
    assert dropped in kept and len(kept.encode() if utf8 else kept) <= limit
