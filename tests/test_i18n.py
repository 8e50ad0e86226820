"""Messages in the lab's languages: every catalog complete and consistent, the language chosen as
documented, and Persian output free of broken bidi in every format."""
from __future__ import annotations

import json
import re
import shutil
import string
import subprocess
import sys
from pathlib import Path

import pytest

from retrylab import exercise as exercises
from retrylab import bidi, i18n, verify
from retrylab.fixtures.backoff_dlq import corpus
from retrylab.grading import grade
from retrylab.reporters import FORMATS
from retrylab.results import Report, StepResult

HARNESS = Path(i18n.__file__).resolve().parent
CHECKS = exercises.CHECKS_DIR
EXERCISES = sorted(exercises.exercises().values(), key=lambda e: e.id)
SCRIPTS = {"zh": re.compile(r"[\u4e00-\u9fff]"), "ru": re.compile(r"[\u0400-\u04ff]"),
           "fa": re.compile(r"[\u0600-\u06ff]")}


def _catalogs():
    yield "engine", i18n.engine()
    for exercise in EXERCISES:
        yield exercise.id, i18n.exercise_catalog(exercise)
    for folder in sorted((Path(i18n.__file__).parent / "brokers").glob("*/locales")):
        yield f"broker {folder.parent.name}", i18n.catalog(folder)


# --------------------------------------------------------------------------------------------
# catalogs: complete, same placeholders, plural forms per language


@pytest.mark.parametrize("name, catalog", list(_catalogs()), ids=[n for n, _ in _catalogs()])
def test_catalog_has_every_key_in_every_language_with_the_same_placeholders(name, catalog):
    assert catalog.problems() == []
    for lang in i18n.LANGUAGES:
        assert len(catalog.messages[lang]) == len(catalog.messages["en"]), lang


def _broken_copy(tmp_path: Path, lang: str, old: str, new: str) -> i18n.Catalog:
    folder = tmp_path / "locales"
    folder.mkdir()
    for path in i18n.ENGINE_LOCALES.glob("*.toml"):
        text = path.read_text(encoding="utf-8")
        if path.stem == lang:
            assert old in text
            text = text.replace(old, new, 1)
        (folder / path.name).write_text(text, encoding="utf-8")
    return i18n.Catalog(folder)


@pytest.mark.parametrize("lang, old, new, complaint", [
    ("ru", 'tally = "пройдено шагов: {passed}/{total} ({seconds:.1f} с)"\n', "", "missing report.tally"),
    ("zh", "{passed}/{total} 个步骤通过（{seconds:.1f} 秒）", "{passed}/{count} 个步骤通过（{seconds:.1f} 秒）",
     "report.tally: placeholders"),
    ("fa", "{seconds:.1f} ثانیه", "{seconds} ثانیه", "report.tally: placeholders"),
    ("fa", 'pass = "قبول"', 'pass = "قبول"\nextra = "x"', "extra is not in English"),
])
def test_a_missing_key_or_a_different_placeholder_is_reported(tmp_path, lang, old, new, complaint):
    problems = _broken_copy(tmp_path, lang, old, new).problems()
    assert any(complaint in p and f"{lang}.toml" in p for p in problems), problems


def test_a_plural_message_needs_each_languages_forms(tmp_path):
    folder = tmp_path / "locales"
    folder.mkdir()
    (folder / "en.toml").write_text('[n]\nplural = "count"\none = "{count} entry"\nother = "{count} entries"\n')
    (folder / "zh.toml").write_text('[n]\nplural = "count"\nother = "{count} 条"\n')
    (folder / "ru.toml").write_text('[n]\nplural = "count"\none = "{count} запись"\nmany = "{count} записей"\n')
    (folder / "fa.toml").write_text('n = "{count} ورودی"\n')
    problems = i18n.Catalog(folder).problems()
    assert any("ru.toml: n: plural forms" in p for p in problems), problems
    assert any("fa.toml: n: plural by None" in p for p in problems), problems
    assert not any("zh.toml" in p for p in problems), problems


@pytest.mark.parametrize("count, form", [(1, "запись"), (2, "записи"), (5, "записей"), (11, "записей"),
                                         (21, "запись"), (22, "записи"), (112, "записей"), (0, "записей")])
def test_russian_plural_categories(count, form):
    text = i18n.exercise_catalog(exercises.get("backoff-dlq")).text("step8.dlq_left", "ru", dlq="q", count=count)
    assert re.search(rf" {count} {form}[;,. ]", text), text


def _keys_used(folder: Path, call: str) -> set[tuple[str, str]]:
    pattern = re.compile(rf"\b(?:{call})\(\s*\"([A-Za-z0-9_.\-]+)\"")
    found = set()
    for path in folder.rglob("*.py"):
        for key in pattern.findall(path.read_text(encoding="utf-8")):
            found.add((path.name, key))
    return found


def test_every_key_the_code_names_exists():
    engine = i18n.engine()
    for path, key in _keys_used(HARNESS, r"label|i18n\.label"):
        assert engine.has(key), f"{path}: {key}"
    for status in ("pass", "fail", "error"):  # built as f"report.{status}"
        assert engine.has(f"report.{status}")
    for exercise in EXERCISES:
        catalog = i18n.exercise_catalog(exercise)
        used = _keys_used(exercise.folder, r"tr|_Reject")
        assert used, exercise.id
        for path, key in used:
            assert catalog.has(key), f"{path}: {key}"
        for step in exercise.steps:
            assert catalog.has(f"steps.{step.slug}.goal"), step.slug


def test_keys_built_at_run_time_and_verifys_lab_facts_exist():
    """Keys the scan above cannot see: `verify`'s facts about backoff-dlq are in the engine's
    verify.py but come from the exercise's catalog; the advanced checks name a kind's key by the kind."""
    from retrylab.checks.backoff_dlq import advanced
    catalog = i18n.exercise_catalog(exercises.get("backoff-dlq"))
    pattern = re.compile(r"\btr\(\s*\"([A-Za-z0-9_.\-]+)\"")
    used = pattern.findall((exercises.get("backoff-dlq").folder / "verifiers.py").read_text(encoding="utf-8"))
    assert len(used) > 30
    for key in used:
        assert catalog.has(key) and key.startswith("verify."), key
    for kind in advanced.KINDS:
        assert catalog.has(f"advanced_msg.kinds.{kind}"), kind


def test_lab_step_checks_build_their_messages_from_the_catalog():
    """No learner-facing English literal left in the lab's step checks and their helpers."""
    literal = re.compile(r"""\b(?:fail|_Reject)\(\s*f?["'][^"']*\s[A-Za-z]""")  # words, not a key
    folder = CHECKS / "backoff_dlq"
    modules = [*folder.glob("test_step*.py"), *folder.glob("test_advanced_*.py"), folder / "observe.py",
               folder / "artifacts.py", folder / "stored_values.py", folder / "advanced.py"]
    assert len(modules) == 17
    for module in modules:
        found = literal.findall(module.read_text(encoding="utf-8"))
        assert not found, (module.name, found)


# --------------------------------------------------------------------------------------------
# choosing the language


@pytest.mark.parametrize("environ, expected", [
    ({}, "en"),
    ({"LANG": "C.UTF-8"}, "en"),
    ({"LANG": "POSIX"}, "en"),
    ({"LANG": "zh_CN.UTF-8"}, "zh"),
    ({"LANG": "ru_RU.UTF-8"}, "ru"),
    ({"LANG": "fa_IR"}, "fa"),
    ({"LANG": "de_DE.UTF-8"}, "en"),
    ({"LC_MESSAGES": "fa_IR.UTF-8", "LANG": "ru_RU.UTF-8"}, "fa"),
    ({"LC_ALL": "zh_TW.UTF-8", "LC_MESSAGES": "fa_IR", "LANG": "ru_RU"}, "zh"),
    ({"LC_ALL": "de_DE", "LANG": "ru_RU"}, "en"),           # the locale is German: no translation
    ({"LANGUAGE": "ru:zh", "LANG": "fa_IR"}, "ru"),
    ({"LANGUAGE": "de:fa", "LANG": "zh_CN"}, "fa"),          # first language we have
    ({"LANGUAGE": "de:it", "LANG": "zh_CN"}, "zh"),          # none: the locale decides
    ({"LANGUAGE": "", "LC_ALL": "", "LANG": "ru_RU"}, "ru"),  # empty means unset
])
def test_language_from_the_locale_variables(environ, expected):
    assert i18n.from_environment(environ) == expected
    assert i18n.resolve(None, environ) == expected


def test_an_explicit_language_wins_and_an_unknown_one_is_refused():
    assert i18n.resolve("fa", {"LANG": "ru_RU"}) == "fa"
    assert i18n.resolve("zh_CN", {}) == "zh"
    with pytest.raises(ValueError, match="unknown language"):
        i18n.resolve("de")


def test_use_sets_the_current_language_for_the_block_only():
    tr = i18n.translator(CHECKS / "backoff_dlq" / "locales")
    assert i18n.current() == "en"
    with i18n.use("ru"):
        assert i18n.current() == "ru"
        assert tr("json.empty") == "пустое значение"
        with i18n.use("zh"):
            assert tr("json.empty") == "为空"
        assert i18n.current() == "ru"
    assert tr("json.empty") == "empty"


# --------------------------------------------------------------------------------------------
# bidi: Persian text stays readable


def _latin_outside_isolates(text: str) -> list[str]:
    """Latin letters and digits of right-to-left lines that no isolate encloses."""
    outside = []
    for line in text.split("\n"):
        if not bidi.has_rtl(line) or line.lstrip(" ").startswith(bidi.LRM):
            continue  # a left-to-right line (a plot row): its direction is its own
        depth = 0
        for char in line:
            if char in (bidi.FSI, bidi.LRI, bidi.RLI):
                depth += 1
            elif char == bidi.PDI:
                depth -= 1
            elif depth == 0 and re.match(r"[A-Za-z0-9]", char):
                outside.append(char)
    return outside


def _sample_params(template: str) -> dict:
    values = {}
    for _, name, spec, _ in string.Formatter().parse(template):
        if name is None:
            continue
        numeric = spec and spec[-1] in "dfgxeE%"
        values[name] = 3 if numeric and spec.endswith(("d", "x")) else 2.5 if numeric else f"'{name}.txt' (x=1)"
    return values


def test_every_persian_message_isolates_its_latin_fragments_and_stays_balanced():
    checked = 0
    for _, catalog in _catalogs():
        for key, message in catalog.messages["fa"].items():
            for template in message.forms.values():
                text = i18n.render(template, "fa", _sample_params(template))
                assert bidi.bidi_problems(text) == [], (key, text)
                assert _latin_outside_isolates(text) == [], (key, text)
                checked += 1
    assert checked > 150


@pytest.mark.parametrize("template, params, expected", [
    ("خط {n} از فایل {name}", {"n": 3, "name": "jitter.txt"},
     "خط \u20683\u2069 از فایل \u2068jitter.txt\u2069"),
    ("{passed}/{total} مرحله", {"passed": 6, "total": 8}, "\u20686/8\u2069 مرحله"),      # one block, not 8/6
    ("مقدار attempt={n} است", {"n": 2}, "مقدار \u2068attempt=2\u2069 است"),
    ("بیشتر از {max}: jitter کامل", {"max": 8}, "بیشتر از \u20688\u2069: \u2068jitter\u2069 کامل"),
    ("با random.uniform(0, {max}) بکشید.", {"max": 8}, "با \u2068random.uniform(0, 8)\u2069 بکشید."),
    ("(مثلاً attempt=2 wait=4)", {}, "(مثلاً \u2068attempt=2 wait=4\u2069)"),
    ("راهنما: {hint}", {"hint": "در jitter کامل"}, "راهنما: \u2068در \u2068jitter\u2069 کامل\u2069"),
])
def test_persian_rendering_isolates_fragments_as_whole_blocks(template, params, expected):
    assert i18n.render(template, "fa", params) == expected


def test_other_languages_get_no_bidi_controls():
    for lang in ("en", "zh", "ru"):
        text = i18n.render("line {n} of {name}: {x}", lang, {"n": 3, "name": "a.txt", "x": "y"})
        assert not bidi.BIDI_CONTROLS.intersection(text)


def test_a_learners_stray_bidi_control_cannot_reverse_the_rest_of_a_line():
    evil = "abc\u202edef\u2066"
    for lang in i18n.LANGUAGES:
        text = i18n.engine().text("report.could_not_grade", lang, error=evil)
        assert bidi.bidi_problems(text) == []
        assert "\\u202e" in text and "\\u2066" in text


@pytest.mark.parametrize("text, problems", [
    ("a\u2068b\u2069c", 0),
    ("a\u2068b\u202bc\u202c\u2069", 0),
    ("a\u2068b", 1),
    ("b\u2069", 1),
    ("\u202eabc", 1),
    ("\u2068a\nb\u2069", 2),            # an isolate does not span lines
    ("\u2068\u202ba\u2069", 1),          # the embedding is left open inside the isolate
])
def test_bidi_problems_finds_unbalanced_controls_per_line(text, problems):
    assert len(bidi.bidi_problems(text)) == problems
    assert bidi.bidi_problems(bidi.balance(text)) == []


@pytest.mark.parametrize("limit", range(1, 60))
def test_truncation_never_leaves_an_isolate_open(limit):
    text = i18n.render("فایل {a} و {b} و {c} در خط {d}", "fa", {"a": "x" * 9, "b": "yy", "c": "zzz", "d": 12})
    cut = bidi.truncate(text, limit)
    assert len(cut) <= max(limit, 3)
    assert bidi.bidi_problems(cut) == []


def test_the_parsers_problems_keep_their_english_bound_and_get_more_room_in_other_languages():
    from retrylab.checks.backoff_dlq import artifacts
    from retrylab.checks.backoff_dlq import stored_values as messages

    data = b"attempt=0 wait=1\n" + b"attempt=1 wait=" + b"9" * 150 + b"\n"
    for lang in i18n.LANGUAGES:
        with i18n.use(lang):
            problem = artifacts.parse_schedule(data).problem
        limit = messages.MAX_PROBLEM * (1 if lang == "en" else 1.5)
        assert 0 < len(problem) <= limit and bidi.bidi_problems(problem) == []
        if lang != "en":
            assert SCRIPTS[lang].search(problem), problem


# --------------------------------------------------------------------------------------------
# graded in each language: messages, titles, hints, report labels; every format


@pytest.fixture(scope="module")
def failing_reports(tmp_path_factory):
    """A submission that fails several steps (files and worker), graded in every language."""
    target = tmp_path_factory.mktemp("failing") / "submission"
    shutil.copytree(corpus.REFERENCE, target, ignore=shutil.ignore_patterns("__pycache__"))
    (target / "jitter.txt").write_text("1.5\n2.5\n9.5\n3\n-1\n" + "4.25\n" * 15)
    (target / "capped.txt").write_text("\n".join(str(2 ** n) for n in range(9)) + "\n")
    (target / "schedule.txt").write_text("attempt=0 wait=1\r\nattempt=1 wait=3\r\n")
    (target / "replay.py").unlink()
    return {lang: grade(target, steps=(3, 4, 5, 8), lang=lang) for lang in i18n.LANGUAGES}


def test_each_language_gets_its_own_messages_titles_and_hints(failing_reports):
    english = failing_reports["en"]
    assert [r.status for r in english.lab_results] == ["fail"] * 4
    for lang, report in failing_reports.items():
        assert report.lang == lang
        assert [r.status for r in report.lab_results] == ["fail"] * 4
        if lang == "en":
            continue
        hint_label = i18n.label("report.hint", lang, hint="").strip()
        for result, original in zip(report.lab_results, english.lab_results):
            assert result.title != original.title and SCRIPTS[lang].search(result.title)
            assert result.message != original.message
            first, *rest = result.message.splitlines()
            assert SCRIPTS[lang].search(first), first          # the verdict itself, not only the hint
            assert rest[-1].startswith(hint_label), rest[-1]
            assert "Hint:" not in result.message
        assert SCRIPTS[lang].search(report.exercise_title)


def test_jitter_and_cap_failures_plot_the_learners_values_in_every_language(failing_reports):
    for lang, report in failing_reports.items():
        jitter, cap = (r for r in report.lab_results if r.number in (4, 5))
        rows = [line for line in jitter.message.splitlines() if "|" in line]
        assert len(rows) == 20 and any("|>" in row for row in rows) and any("<|" in row for row in rows)
        cap_rows = [line for line in cap.message.splitlines() if "|" in line]
        assert len(cap_rows) == 9 and sum("!" in row for row in cap_rows) == 4
        assert i18n.label("report.hint", lang, hint="").strip() in cap.message


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_a_persian_report_of_a_failing_submission_has_no_unbalanced_bidi_controls(failing_reports, format_name):
    report = failing_reports["fa"]
    rendered = FORMATS[format_name](report)
    if format_name == "text":
        assert bidi.bidi_problems(rendered) == []
        assert _latin_outside_isolates(rendered) == []
        texts = [rendered]
    else:
        texts = [r.message for r in report.results]
        for text in texts:
            assert bidi.bidi_problems(text) == []
    # the chosen language reaches every format: its messages are in the output
    decoded = json.loads(rendered) if format_name in ("exercism", "gradescope") else rendered
    flat = json.dumps(decoded, ensure_ascii=False) if not isinstance(decoded, str) else decoded
    assert SCRIPTS["fa"].search(flat)
    assert all(bidi.FSI in text for text in texts)


def test_text_report_labels_in_each_language():
    results = (StepResult(name="worker", title="t", status="pass", number=1),
               StepResult(name="requeue", title="t", status="fail", number=2, message="m"))
    for lang in i18n.LANGUAGES:
        report = Report(exercise_id="x", exercise_title="T", submission="/s", backend="fake",
                        harness_version="0", results=results, lang=lang)
        text = FORMATS["text"](report)
        assert i18n.label("report.tally", lang, passed=1, total=2, seconds=0.0) in text
        assert i18n.label("report.pass", lang) in text and i18n.label("report.fail", lang) in text
        assert bidi.bidi_problems(text) == []


def test_cli_takes_the_language_from_lang_or_the_locale(tmp_path):
    def run(*args, **env):
        done = subprocess.run([sys.executable, "-m", "retrylab", "check", str(tmp_path), "--step", "3",
                               "--format", "exercism", *args], capture_output=True, text=True, timeout=120,
                              env={"PATH": "/usr/bin:/bin", **env})
        assert done.returncode == 1, done.stderr
        return json.loads(done.stdout)["tests"][0]["message"]

    english = run()
    assert english.startswith("schedule.txt is missing from your submission")
    assert SCRIPTS["ru"].search(run(LANGUAGE="ru", LANG="fa_IR.UTF-8"))
    assert SCRIPTS["zh"].search(run(LC_ALL="zh_CN.UTF-8"))
    assert SCRIPTS["fa"].search(run("--lang", "fa", LANG="ru_RU.UTF-8"))
    assert run("--lang", "en", LANGUAGE="zh") == english


def test_plain_pytest_takes_lang_too(tmp_path):
    checks = CHECKS / "backoff_dlq"
    done = subprocess.run([sys.executable, "-m", "pytest", str(checks / "test_step3_schedule.py"),
                           "--solution", str(tmp_path), "--lang", "ru", "-p", "no:randomly", "-q"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "в вашем решении нет schedule.txt" in done.stdout


# --------------------------------------------------------------------------------------------
# everything else a learner reads: advanced checks, `verify`, limits, the other report formats,
# `grade-batch`


def _lines_in(lang: str, text: str) -> list[str]:
    """The lines of a message that are not in `lang`'s script. Indented lines are quoted learner
    output (a traceback) or a plot, left as they are."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith(" ")
            and not SCRIPTS[lang].search(line)]


def _assert_in_language(lang: str, text: str) -> None:
    assert text.strip()
    if lang == "en":
        assert not any(script.search(text) for script in SCRIPTS.values()), text
        return
    assert _lines_in(lang, text) == [], text
    if lang in i18n.RTL:
        assert bidi.bidi_problems(text) == [], text
        assert _latin_outside_isolates(text) == [], text


def _advanced_submissions(root: Path) -> dict[str, tuple[Path, set[str]]]:
    """Two known-wrong submissions that fail every advanced check between them, with what each fails.

    "waits": advanced-constant-wait with advanced-alert-always-zero's alert.py. "dead-letters":
    advanced-dlq-trimmed (LTRIM on the DLQ) whose worker retries only timeouts, 503 and 429, as
    advanced-retry-only-listed-errors's does (the lab's own failure goes to the DLQ at once)."""
    entries = {e.name: e for e in corpus.entries()}
    waits = entries["advanced-constant-wait"].materialize(root / "waits")
    shutil.copy(entries["advanced-alert-always-zero"].folder / "alert.py", waits / "alert.py")
    letters = entries["advanced-dlq-trimmed"].materialize(root / "dead-letters")
    worker = (letters / "worker.py").read_text(encoding="utf-8")
    classify = "    return not isinstance(exc, (ValueError, LookupError))\n"
    assert classify in worker
    (letters / "worker.py").write_text(worker.replace(classify, "    return False\n"), encoding="utf-8")
    return {
        "waits": (waits, {"advanced:backoff-applied", "advanced:non-blocking", "advanced:dlq-alert"}),
        "dead-letters": (letters, {"requeue", "dlq", "dlq-record", "advanced:backoff-applied",
                                  "advanced:error-classes", "advanced:no-auto-replay"}),
    }


@pytest.fixture(scope="module")
def advanced_reports(tmp_path_factory):
    """Each submission graded in each language (about a second per grading)."""
    submissions = _advanced_submissions(tmp_path_factory.mktemp("advanced"))
    return {(name, lang): (grade(folder, lang=lang), failing)
            for name, (folder, failing) in submissions.items() for lang in i18n.LANGUAGES}


@pytest.mark.parametrize("lang", i18n.LANGUAGES)
@pytest.mark.parametrize("name", ["waits", "dead-letters"])
def test_advanced_checks_and_the_lab_steps_they_share_a_run_with_speak_the_language(advanced_reports, name, lang):
    report, failing = advanced_reports[name, lang]
    assert {r.name for r in report.results if not r.passed} == failing   # the same verdicts in every language
    for result in report.results:
        if not result.passed:
            _assert_in_language(lang, result.message)


def test_an_advanced_verdict_keeps_its_facts_across_languages(advanced_reports):
    """A translation says the same thing: the numbers, names and commands of the English verdict are
    in every other one (a placeholder dropped from one language would not be caught otherwise)."""
    def facts(text: str) -> list[str]:
        verdict = text.split("\n")[0]
        # how the learner's script ended ("worker.py exited with status 0", "... was stopped") is the
        # engine's phrase, and may differ between two gradings: only the check's own facts count
        verdict = re.sub(r"\b(?:worker|replay|alert)\.py\b[^.\u3002]*", "", verdict)
        return sorted(re.findall(r"LTRIM[^()]*?-1|q:tasks:dlq|\d+\.\d+|\b\d+\b", verdict))

    english = {r.name: r.message for r in advanced_reports["dead-letters", "en"][0].results if not r.passed}
    for lang in ("zh", "ru", "fa"):
        report = advanced_reports["dead-letters", lang][0]
        for result in report.results:
            if result.name.startswith("advanced:") and not result.passed:
                assert facts(result.message) == facts(english[result.name]), (lang, result.message)


def test_every_kind_and_advanced_phrase_builder_speaks_the_language():
    from retrylab.checks.backoff_dlq import advanced

    waits = [advanced.Wait(after=n, seconds=s, others=0) for n, s in enumerate((1.0, 1.0, 1.0), start=1)]
    too_long = [advanced.Wait(after=1, seconds=9.0, others=0)]
    for lang in i18n.LANGUAGES:
        with i18n.use(lang):
            texts = [advanced.describe_kind(kind) + " " + advanced.describe_waits(waits) for kind in advanced.KINDS]
            texts += [advanced.backoff_problem(waits), advanced.backoff_problem(too_long),
                      advanced.backoff_problem([advanced.Wait(after=1, seconds=0.0, others=0)])]
        for text in texts:
            assert text and (lang == "en" or SCRIPTS[lang].search(text)), (lang, text)


def test_work_run_beside_the_checks_speaks_the_gradings_language():
    """The advanced run (and the alert runs) go on in threads of their own, where what a learner run
    says (a limit it hit, output it cut) is built: in the grading's language, not the default."""
    from retrylab.checks.backoff_dlq import advanced
    from retrylab.background import Beside
    with i18n.use("fa"):
        beside = Beside(lambda cancelled: (i18n.current(), advanced.describe_kind("bad")), "i18n-test")
    lang, text = beside.result()
    assert lang == "fa" and SCRIPTS["fa"].search(text)


def _verify(capsys, *args: str) -> tuple[int, str, str]:
    from retrylab import cli
    status = cli.main(["verify", *args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("lang", i18n.LANGUAGES)
def test_verify_says_its_facts_the_unchecked_list_and_the_way_on_in_the_language(
        lang, private_redis_server, tmp_path, capsys):
    from retrylab.checks.backoff_dlq.lab import DLQ
    folder = tmp_path / "qr"
    shutil.copytree(corpus.REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    entry = {"payload": {"id": "m1", "kind": "bad", "data": {}}, "error": "boom", "attempts": 4,
             "first_seen_at": 1796037722.5}
    client = private_redis_server.client()
    client.rpush(DLQ, json.dumps(entry))
    try:
        status, out, err = _verify(capsys, "--step", "7", "--redis-url", private_redis_server.url,
                                   "--lang", lang, str(folder))
    finally:
        client.delete(DLQ)
        client.rpush(DLQ, json.dumps(entry))   # the same state again, for the API's own report
        try:
            result = verify.verify(folder, 7, broker_url=private_redis_server.url, lang=lang)
        finally:
            client.delete(DLQ)
    assert (status, err) == (1, "")
    shown = verify.render(result)
    assert shown in out, out                                   # the command printed that report
    assert [f.status for f in result.facts] == [verify.OK, verify.OK, verify.FAIL], shown   # attempts is 4
    assert len(result.unchecked) == 3
    assert sum(line.startswith("  ") for line in shown.splitlines()) == 6, shown
    assert f"retrylab check {folder} --step 7" in shown          # the command stays as it is typed
    assert i18n.label("report.hint", lang, hint="").strip() in shown
    _assert_in_language(lang, shown.replace(str(folder), "").replace(private_redis_server.url, ""))


@pytest.mark.parametrize("lang", ["zh", "ru", "fa"])
def test_verify_cannot_check_in_the_language_from_the_locale(lang, tmp_path, capsys, monkeypatch):
    from retrylab.brokers.redis.endpoint import free_port
    monkeypatch.setenv("LANGUAGE", lang)
    status, out, err = _verify(capsys, "--step", "6", "--redis-url", f"redis://127.0.0.1:{free_port()}/0",
                               str(corpus.REFERENCE))
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and SCRIPTS[lang].search(err), err


def test_a_step_over_its_time_limit_says_so_in_the_language():
    import time
    from retrylab.limits import StepClock, StepTimeLimit, step_label

    step = exercises.get("backoff-dlq").step(8)
    for lang in ("zh", "ru", "fa"):
        with i18n.use(lang):
            clock = StepClock()
            with pytest.raises(StepTimeLimit) as caught:
                with clock.phase(8, step_label(step), 0.2):
                    clock.cut(i18n.label("run.cut", script="replay.py"))
                    time.sleep(30)  # the alarm ends it
        message = caught.value.message
        assert "replay.py" in message and "0.2" in message
        _assert_in_language(lang, message)


def _every_ending(limits: list[str]) -> list:
    """A script's result for each way it can end: with each limit it may hit, and with none."""
    from retrylab.sandbox import ScriptResult
    ending = dict(script="worker.py", stdout="", stderr="", seconds=12.0)
    found = [ScriptResult(returncode=None, stopped="settled", **ending),
             ScriptResult(returncode=-9, stopped=None, **ending),
             ScriptResult(returncode=3, stopped=None, **ending)]
    for limit in limits:
        found += [ScriptResult(returncode=None, stopped="timeout", limit=limit, **ending),
                  ScriptResult(returncode=1, stopped=None, limit=limit, **ending),
                  ScriptResult(returncode=0, stopped=None, limit=limit, **ending)]
    return found


def test_how_a_script_ended_and_the_limit_it_hit_are_said_in_the_language():
    from retrylab.sandbox import Limits

    for lang in i18n.LANGUAGES:
        with i18n.use(lang):
            phrases = [Limits().phrase(kind) for kind in ("memory", "cpu", "file size", "processes")]
            told = [r.describe() for r in _every_ending(phrases)]
        assert len(set(told)) == len(told) == 15
        for text in told:
            assert "worker.py" in text
            _assert_in_language(lang, text)


def test_why_the_harness_stopped_a_script_is_said_in_the_language():
    from retrylab.sandbox import ScriptResult
    from retrylab.settle import Reason

    reasons = [r for r in Reason if r not in (Reason.EXITED, Reason.WALL)]  # those two say it without a reason
    for lang in i18n.LANGUAGES:
        with i18n.use(lang):
            told = [ScriptResult(script="worker.py", returncode=None, stopped="settled", stdout="", stderr="",
                                 seconds=3.0, reason=r.value, detail="BLPOP q 0", broker="Redis").describe()
                     for r in reasons]
            told.append(i18n.label("run.not_started", script="worker.py", cpu=0.1, broker="Redis"))
        assert len(set(told)) == len(told)
        for text in told:
            assert "worker.py" in text
            _assert_in_language(lang, text)


@pytest.mark.parametrize("lang, counts", [
    ("en", {1: "the limit of 1 process", 16: "the limit of 16 processes"}),
    ("ru", {1: "лимит в 1 процесс", 3: "лимит в 3 процесса", 64: "лимит в 64 процесса",
            11: "лимит в 11 процессов", 25: "лимит в 25 процессов"}),
])
def test_the_process_limit_is_worded_by_its_number(lang, counts):
    from retrylab.sandbox import Limits
    with i18n.use(lang):
        assert {n: Limits(processes=n).phrase("processes") for n in counts} == counts


def test_output_cut_in_the_sandbox_and_a_shortened_verdict_say_so_in_the_language():
    from retrylab.sandbox import CappedBuffer
    from retrylab.verdict import MESSAGE_LIMIT, CheckFailed

    for lang in ("zh", "ru", "fa"):
        with i18n.use(lang):
            buffer = CappedBuffer(100)
            buffer.feed(b"x" * 1000)
            notice = buffer.text().splitlines()[1]
            long = i18n.engine().text("report.could_not_grade", error="y " * 3000)
            verdict = CheckFailed(long).message
        assert "900" in notice and SCRIPTS[lang].search(notice), notice
        assert len(verdict) <= MESSAGE_LIMIT and SCRIPTS[lang].search(verdict.splitlines()[-1])
        assert bidi.bidi_problems(verdict) == []   # the cut closes what it left open (Persian's isolates)


def _report_in(lang: str) -> Report:
    exercise = exercises.get("backoff-dlq")
    step = exercise.step(3)
    return Report(exercise_id=exercise.id, exercise_title=i18n.exercise_catalog(exercise).text("title", lang),
                  submission="/subs/learner", backend="fake", harness_version="0", lang=lang, results=(
                      StepResult(name=step.slug, title=i18n.step_text(exercise, step, "title", lang), status="fail",
                                 number=3, message="", output="o" * 20_000, location=("schedule.txt", 2)),
                      StepResult(name="dlq", title=i18n.step_text(exercise, exercise.step(6), "title", lang),
                                 status="error", number=6),
                      StepResult(name="advanced:dlq-alert", title="t", status="fail", number=None, weight=0.0,
                                 kind=exercises.ADVANCED)),
                  harness_error="")


@pytest.mark.parametrize("lang", i18n.LANGUAGES)
def test_the_other_formats_label_their_tests_and_notices_in_the_language(lang):
    from retrylab.reporters import exercism, github, gradescope, junit
    report = _report_in(lang)
    tests = exercism.to_dict(report)["tests"]
    assert [t["status"] for t in tests] == ["fail", "error", "fail"]          # machine fields as they were
    assert [t.get("task_id") for t in tests] == [3, 6, None] and tests[2]["name"].startswith("advanced:dlq-alert")
    for test in tests[:2]:
        _assert_in_language(lang, test["name"])
    notice = next(line for line in tests[0]["output"].splitlines() if line.startswith("["))
    _assert_in_language(lang, notice)
    graded = gradescope.to_dict(report)
    assert [t["status"] for t in graded["tests"]] == ["failed", "failed", "failed"]
    _assert_in_language(lang, graded["output"])
    for test in graded["tests"]:
        _assert_in_language(lang, "\n".join(line for line in test["output"].splitlines() if "ooo" not in line))
    cases = list(junit.to_element(report).iter("testcase"))
    _assert_in_language(lang, "\n".join(c.get("name") for c in cases[:2]))
    _assert_in_language(lang, "\n".join(c[0].get("message") for c in cases[:2]))    # the default messages
    annotations = github.render(report, "/w")
    titles = re.findall(r"title=retrylab ([^:]*?)::(.*)", annotations)
    assert len(titles) == 3 and annotations.startswith("::error file=/w/schedule.txt,line=2,")
    for title, message in titles[:2]:
        _assert_in_language(lang, title.replace("%3A", ":") + "\n" + message)


def test_batch_reasons_and_summary_in_the_language(tmp_path):
    from retrylab import batch
    config = batch.BatchConfig(lang="ru")
    submission = batch.Submission("s1", tmp_path)
    row = batch.row_from_report(submission, {"results": [], "harness_version": "0"}, 1.0, config)
    assert row["status"] == "error" and row["reason"].startswith("проверяющая система не смогла оценить шаг 1")
    _assert_in_language("zh", batch._no_report(-9, "MemoryError", "zh"))
    assert "SIGKILL" in batch._no_report(-9, "", "fa") and "MemoryError" in batch._no_report(2, "MemoryError", "fa")
    empty = tmp_path / "subs" / "empty"
    empty.mkdir(parents=True)
    out = tmp_path / "book.csv"
    done = subprocess.run([sys.executable, "-m", "retrylab", "grade-batch", str(empty.parent), "--out", str(out),
                           "--lang", "zh"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "已评 1 份" in done.stderr.splitlines()[-1], done.stderr
    assert "fail" in out.read_text(encoding="utf-8")    # the gradebook's values are the same in every language
