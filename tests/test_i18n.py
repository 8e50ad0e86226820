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
from retrylab import i18n
from retrylab.fixtures import corpus
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
        used = _keys_used(exercise.folder, r"tr|_Reject|tr\.lazy")
        assert used, exercise.id
        for path, key in used:
            assert catalog.has(key), f"{path}: {key}"
        for step in exercise.steps:
            assert catalog.has(f"steps.{step.slug}.goal"), step.slug


def test_lab_step_checks_build_their_messages_from_the_catalog():
    """No learner-facing English literal left in the lab's step checks and their helpers."""
    literal = re.compile(r"""\b(?:fail|_Reject)\(\s*f?["'][^"']*\s[A-Za-z]""")  # words, not a key
    folder = CHECKS / "backoff_dlq"
    modules = [*folder.glob("test_step*.py"), folder / "observe.py", folder / "artifacts.py", folder / "messages.py"]
    assert len(modules) == 11
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
        if not i18n.has_rtl(line) or line.lstrip(" ").startswith(i18n.LRM):
            continue  # a left-to-right line (a plot row): its direction is its own
        depth = 0
        for char in line:
            if char in (i18n.FSI, i18n.LRI, i18n.RLI):
                depth += 1
            elif char == i18n.PDI:
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
                assert i18n.bidi_problems(text) == [], (key, text)
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
        assert not i18n.BIDI_CONTROLS.intersection(text)


def test_a_learners_stray_bidi_control_cannot_reverse_the_rest_of_a_line():
    evil = "abc\u202edef\u2066"
    for lang in i18n.LANGUAGES:
        text = i18n.engine().text("report.could_not_grade", lang, error=evil)
        assert i18n.bidi_problems(text) == []
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
    assert len(i18n.bidi_problems(text)) == problems
    assert i18n.bidi_problems(i18n.balance(text)) == []


@pytest.mark.parametrize("limit", range(1, 60))
def test_truncation_never_leaves_an_isolate_open(limit):
    text = i18n.render("فایل {a} و {b} و {c} در خط {d}", "fa", {"a": "x" * 9, "b": "yy", "c": "zzz", "d": 12})
    cut = i18n.truncate(text, limit)
    assert len(cut) <= max(limit, 3)
    assert i18n.bidi_problems(cut) == []


def test_the_parsers_problems_keep_their_english_bound_and_get_more_room_in_other_languages():
    from retrylab.checks.backoff_dlq import artifacts, messages

    data = b"attempt=0 wait=1\n" + b"attempt=1 wait=" + b"9" * 150 + b"\n"
    for lang in i18n.LANGUAGES:
        with i18n.use(lang):
            problem = artifacts.parse_schedule(data).problem
        limit = messages.MAX_PROBLEM * (1 if lang == "en" else 1.5)
        assert 0 < len(problem) <= limit and i18n.bidi_problems(problem) == []
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
        assert i18n.bidi_problems(rendered) == []
        assert _latin_outside_isolates(rendered) == []
        texts = [rendered]
    else:
        texts = [r.message for r in report.results]
        for text in texts:
            assert i18n.bidi_problems(text) == []
    # the chosen language reaches every format: its messages are in the output
    decoded = json.loads(rendered) if format_name in ("exercism", "gradescope") else rendered
    flat = json.dumps(decoded, ensure_ascii=False) if not isinstance(decoded, str) else decoded
    assert SCRIPTS["fa"].search(flat)
    assert all(i18n.FSI in text for text in texts)


def test_text_report_labels_in_each_language():
    results = (StepResult(name="worker", title="t", status="pass", number=1),
               StepResult(name="requeue", title="t", status="fail", number=2, message="m"))
    for lang in i18n.LANGUAGES:
        report = Report(exercise_id="x", exercise_title="T", submission="/s", backend="fake",
                        harness_version="0", results=results, lang=lang)
        text = FORMATS["text"](report)
        assert i18n.label("report.tally", lang, passed=1, total=2, seconds=0.0) in text
        assert i18n.label("report.pass", lang) in text and i18n.label("report.fail", lang) in text
        assert i18n.bidi_problems(text) == []


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
