"""Messages in the lab's languages: English (the default), Chinese, Russian and Persian.

The seeds of the labs are written in Chinese, Russian and Persian; a learner reads the grader's
verdicts in the language they chose. Every text a learner sees comes from a *catalog*: a folder of
TOML files, one per language (``en.toml``, ``zh.toml``, ``ru.toml``, ``fa.toml``), mapping keys to
``str.format`` templates with named placeholders (``"line {lineno} of {name} ..."``). The engine has
its own catalog (``harness/locales``: report labels); an exercise ships its own
(``checks/<exercise>/locales``: check messages, step goals), so the engine stays lab-agnostic. An
exercise's step titles and hints are written in English in its ``exercise.toml`` (their one English
place) and translated under ``steps.<slug>.title`` / ``.hint`` (``advanced.<id>.*``) in the others.

A message whose wording depends on a number is a table naming the number's placeholder and giving
one template per plural category (CLDR: English one/other, Russian one/few/many, Chinese and
Persian other)::

    [left_over]
    plural = "count"
    one = "{name} still holds {count} entry ..."
    other = "{name} still holds {count} entries ..."

The language is chosen once (``--lang``, else LANGUAGE / LC_ALL / LC_MESSAGES / LANG, else English)
and made *current* (:func:`use`) for the code that builds messages, so that a parser deep inside a
check need not be handed it.

Persian is written right to left, and a terminal that implements the Unicode bidirectional
algorithm reorders a line that mixes it with left-to-right text; file names, code, numbers and
quoted learner text inside a Persian sentence would be scrambled with their neighbouring
punctuation. So in a right-to-left language a filled-in message is made safe line by line: each run
of Latin text in it (literal or substituted: ``attempt={n}`` and ``{passed}/{total}`` stay one block)
and each substituted value holding right-to-left text is wrapped in FIRST STRONG ISOLATE ... POP
DIRECTIONAL ISOLATE (U+2068 ... U+2069), and so laid out on its own and moved as one block. A plot
keeps its rows left to right (:func:`ltr_lines`). Values are also cleaned of unbalanced bidi controls
(a learner's stray U+202E would otherwise reverse the rest of a report line). The text helpers that
do this whatever the language (isolating, balancing, truncating, terminal widths) are retrylab.bidi.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
import string
import tomllib
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

from retrylab import bidi

LANGUAGES = ("en", "zh", "ru", "fa")
DEFAULT = "en"
RTL = frozenset({"fa"})
NAMES = {"en": "English", "zh": "中文", "ru": "Русский", "fa": "فارسی"}
# Precedence as in GNU gettext: LANGUAGE (a colon-separated list) first, then the locale.
LOCALE_VARIABLES = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")
ENGINE_LOCALES = Path(__file__).resolve().parent / "locales"

# CLDR plural categories each language's plural messages must give.
PLURAL_FORMS = {"en": ("one", "other"), "zh": ("other",), "ru": ("one", "few", "many"), "fa": ("other",)}



# --------------------------------------------------------------------------------------------
# choosing the language


def language_of(tag: str | None) -> str | None:
    """The supported language a locale name or language tag names: "zh_CN.UTF-8" -> "zh"; else None
    ("C", "POSIX", "de_DE", "")."""
    if not tag:
        return None
    base = re.split(r"[_.@-]", tag.strip(), maxsplit=1)[0].lower()
    return base if base in LANGUAGES else None


def from_environment(environ: Mapping[str, str] | None = None) -> str:
    """The language the locale variables ask for, English when they name none we have.

    LANGUAGE may list several (``fa:ru``): the first we have wins, else the locale decides. The first
    of LC_ALL, LC_MESSAGES, LANG that is set is the locale; if it names a language we do not have,
    English (not a lower-priority variable: LC_ALL=de_DE overrides LANG=ru_RU).
    """
    env = os.environ if environ is None else environ
    for name in LOCALE_VARIABLES:
        value = env.get(name) or ""
        if not value:
            continue
        if name == "LANGUAGE":
            found = next((lang for lang in map(language_of, value.split(":")) if lang), None)
            if found:
                return found
            continue
        return language_of(value) or DEFAULT
    return DEFAULT


def resolve(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """``explicit`` (``--lang``) when given, else the locale's language; ValueError for an unknown one."""
    if explicit:
        lang = language_of(explicit)
        if lang is None:
            raise ValueError(f"unknown language {explicit!r} (choose one of {', '.join(LANGUAGES)})")
        return lang
    return from_environment(environ)


_current: contextvars.ContextVar[str] = contextvars.ContextVar("retrylab_language", default=DEFAULT)


def current() -> str:
    """The language messages are being built in."""
    return _current.get()


def activate(lang: str) -> contextvars.Token:
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r} (choose one of {', '.join(LANGUAGES)})")
    return _current.set(lang)


def deactivate(token: contextvars.Token) -> None:
    try:
        _current.reset(token)
    except ValueError:  # made in another context (e.g. a hook run elsewhere): restore by value
        previous = token.old_value
        _current.set(DEFAULT if previous is contextvars.Token.MISSING else previous)


@contextlib.contextmanager
def use(lang: str) -> Iterator[str]:
    """Build messages in ``lang`` within the block."""
    token = activate(lang)
    try:
        yield lang
    finally:
        deactivate(token)


# --------------------------------------------------------------------------------------------
# laying text out in the current language


def ltr_lines(text: str, lang: str | None = None) -> str:
    """``text`` (e.g. a plot) laid out left to right line by line even in a right-to-left report: in
    a right-to-left language each line starts with LEFT-TO-RIGHT MARK, the strong character from
    which a terminal takes the line's direction."""
    if (lang or current()) not in RTL:
        return text
    return "\n".join(bidi.LRM + line if line.strip() else line for line in text.split("\n"))


def bounded(text: str, limit: int, ellipsis: str = "\u2026") -> str:
    """``text`` within ``limit`` characters, a limit set for English: translations (and Persian's
    isolates) run longer, so other languages get half as much again."""
    if current() != DEFAULT:
        limit += limit // 2
    return bidi.truncate(text, limit, ellipsis)


# --------------------------------------------------------------------------------------------
# catalogs


def plural_category(lang: str, number) -> str:
    """The CLDR plural category of ``number`` for the forms in PLURAL_FORMS."""
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        return PLURAL_FORMS[lang][-1]
    if isinstance(number, float) and not number.is_integer():
        return "other" if lang != "ru" else "many"
    n = abs(int(number))
    if lang == "en":
        return "one" if n == 1 else "other"
    if lang == "ru":
        if n % 10 == 1 and n % 100 != 11:
            return "one"
        if 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14:
            return "few"
        return "many"
    return "other"


@functools.lru_cache(maxsize=8192)
def _parse(template: str) -> tuple:
    return tuple(string.Formatter().parse(template))


def placeholders(template: str) -> set[tuple[str, str, str]]:
    """(name, format spec, conversion) of every replacement field in a template."""
    return {(name, spec or "", conversion or "") for _, name, spec, conversion in _parse(template)
            if name is not None}


def render(template: str, lang: str, params: Mapping) -> str:
    """Fill ``template``'s named placeholders from ``params``.

    Right to left, the filled-in line is then made safe for the bidi algorithm: a value holding
    right-to-left text (a nested Persian message, a learner's Persian line) is isolated as a block,
    and every run of Latin text (literal or substituted, so ``attempt={n}`` stays one block) too.
    """
    if lang not in RTL:  # no isolates: str.format, then the lines kept free of stray controls
        return bidi.balance(template.format_map(params))
    out = []
    for literal, name, spec, conversion in _parse(template):
        out.append(literal)
        if name is None:
            continue
        value = params[name]
        if conversion:
            value = {"r": repr, "s": str, "a": ascii}[conversion](value)
        text = bidi.balance(format(value, spec) if spec else str(value))
        out.append(bidi.isolate_value(text))
    return bidi.isolate_latin_runs("".join(out))


@dataclass(frozen=True)
class Message:
    key: str
    forms: Mapping[str, str]        # plural category (or "other") -> template
    plural: str | None = None       # the placeholder whose number picks the form

    def template(self, lang: str, params: Mapping) -> str:
        if self.plural is None:
            return self.forms["other"]
        category = plural_category(lang, params.get(self.plural))
        return self.forms.get(category) or self.forms.get("other") or next(iter(self.forms.values()))

    def placeholders(self) -> set[tuple[str, str, str]]:
        return set().union(*(placeholders(t) for t in self.forms.values()))


def _flatten(table: Mapping, prefix: str, into: dict[str, Message], source: Path) -> None:
    for name, value in table.items():
        key = f"{prefix}{name}"
        if isinstance(value, str):
            into[key] = Message(key, {"other": value})
        elif isinstance(value, Mapping) and "plural" in value:
            forms = {k: v for k, v in value.items() if k != "plural"}
            if not all(isinstance(v, str) for v in forms.values()) or not forms:
                raise ValueError(f"{source}: {key}: a plural message maps categories to text")
            into[key] = Message(key, forms, plural=str(value["plural"]))
        elif isinstance(value, Mapping):
            _flatten(value, f"{key}.", into, source)
        else:
            raise ValueError(f"{source}: {key}: expected text or a table, found {type(value).__name__}")


def _literal(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


class _Languages(dict):
    """lang -> that language's messages, each read from its files on first use: a grading speaks one
    language (and English for fallback), and parsing all four catalogs cost more than its checks."""

    def __init__(self, read: Callable[[str], dict]):
        super().__init__()
        self._read = read

    def __missing__(self, lang: str) -> dict:
        if lang not in LANGUAGES:
            raise KeyError(lang)
        found = self[lang] = self._read(lang)
        return found


class Catalog:
    """One folder of message files. ``english`` adds English texts kept elsewhere (an exercise's
    step titles and hints)."""

    def __init__(self, directory: Path, english: Mapping[str, str] | None = None):
        self.directory = Path(directory)
        self._twice: dict[str, list[str]] = {}
        self._english = dict(english or {})
        self.external = frozenset(self._english)
        self.messages: dict[str, dict[str, Message]] = _Languages(self._read)
        _made.add(self)

    def _read(self, lang: str) -> dict[str, Message]:
        found: dict[str, Message] = {}
        twice: list[str] = []
        # <lang>.toml, then any <lang>.<part>.toml: a large catalog may be kept in parts (one per step)
        for path in (self.directory / f"{lang}.toml", *sorted(self.directory.glob(f"{lang}.*.toml"))):
            if path.is_file():
                part: dict[str, Message] = {}
                _flatten(tomllib.loads(path.read_text(encoding="utf-8")), "", part, path)
                twice += [f"{path.name}: {key} is also in another part" for key in sorted(set(part) & set(found))]
                found.update(part)
        if lang == DEFAULT:
            for key, text in self._english.items():
                found[key] = Message(key, {"other": _literal(text)})
        self._twice[lang] = twice
        return found

    def _language(self, lang: str) -> dict[str, Message]:
        return self.messages[lang] if lang in LANGUAGES else {}

    def has(self, key: str, lang: str = DEFAULT) -> bool:
        return key in self._language(lang)

    def text(self, key: str, lang: str | None = None, /, **params) -> str:
        """The message ``key`` in ``lang`` (default: the current language), filled from ``params``.
        A key missing in ``lang`` falls back to English (tests forbid that); unknown: KeyError."""
        lang = lang or current()
        message = self._language(lang).get(key)
        if message is None:
            message, lang = self.messages[DEFAULT].get(key), DEFAULT
            if message is None:
                raise KeyError(f"no message {key!r} in {self.directory}")
        return render(message.template(lang, params), lang, params)

    def problems(self) -> list[str]:
        """Everything that keeps this catalog from being complete and consistent."""
        every = {lang: self.messages[lang] for lang in LANGUAGES}     # read them all
        found = [line for lang in LANGUAGES for line in self._twice[lang]]
        english = every[DEFAULT]
        for lang in LANGUAGES:
            messages = self.messages[lang]
            name = f"{self.directory.name}/{lang}.toml"
            for key in sorted(set(english) - set(messages)):
                found.append(f"{name}: missing {key}")
            for key in sorted(set(messages) - set(english)):
                found.append(f"{name}: {key} is not in English")
            for key in sorted(set(messages) & set(english)):
                message, reference = messages[key], english[key]
                try:
                    names, wanted = message.placeholders(), reference.placeholders()
                except ValueError as exc:
                    found.append(f"{name}: {key}: not a valid template ({exc})")
                    continue
                if names != wanted:
                    found.append(f"{name}: {key}: placeholders {_show(names)}, English has {_show(wanted)}")
                if (message.plural is None) != (reference.plural is None) or message.plural != reference.plural:
                    found.append(f"{name}: {key}: plural by {message.plural!r}, English by {reference.plural!r}")
                elif message.plural is not None:
                    missing = set(PLURAL_FORMS[lang]) - set(message.forms)
                    extra = set(message.forms) - set(PLURAL_FORMS[lang])
                    if missing or extra:
                        found.append(f"{name}: {key}: plural forms {sorted(message.forms)}, "
                                     f"{lang} needs {list(PLURAL_FORMS[lang])}")
        return found


_made: "weakref.WeakSet[Catalog]" = weakref.WeakSet()     # every catalog of this process, for preload


def preload(langs: tuple[str, ...]) -> None:
    """Read the engine's catalog and every other made so far in `langs` and English (the fallback). A warm grading
    process does it once: the gradings it forks would each parse the same files again (6 ms of CPU each, English)."""
    engine()
    for found in list(_made):
        for lang in {DEFAULT, *langs}:
            found.messages[lang]


def _show(fields: set) -> str:
    return "{" + ", ".join(sorted(n + (f":{s}" if s else "") + (f"!{c}" if c else "") for n, s, c in fields)) + "}"


@functools.cache
def catalog(directory: Path | str) -> Catalog:
    return Catalog(Path(directory).resolve())


def translator(directory: Path | str) -> Callable[..., str]:
    """``tr(key, **params)``: the message in the current language from the catalog in ``directory``, each
    language's file read on first use."""
    found = catalog(directory)

    def tr(key: str, /, **params) -> str:
        return found.text(key, **params)
    return tr


def engine() -> Catalog:
    """The engine's own labels (reports, commands)."""
    return catalog(ENGINE_LOCALES)


def label(key: str, lang: str | None = None, /, **params) -> str:
    return engine().text(key, lang, **params)


# --------------------------------------------------------------------------------------------
# exercises


def _check_prefix(step) -> str:
    return f"steps.{step.slug}" if step.number is not None else f"advanced.{step.slug}"


@functools.cache
def _exercise_catalog(folder: Path, english: tuple[tuple[str, str], ...]) -> Catalog:
    return Catalog(folder / "locales", dict(english))


def exercise_catalog(exercise) -> Catalog:
    """An exercise's catalog (``<folder>/locales``), with its title and its step titles and hints
    from exercise.toml as their English texts."""
    english = [("title", exercise.title)]
    for step in (*exercise.steps, *exercise.advanced):
        english += [(f"{_check_prefix(step)}.title", step.title), (f"{_check_prefix(step)}.hint", step.hint)]
    return _exercise_catalog(Path(exercise.folder).resolve(), tuple(english))


def step_text(exercise, step, field: str, lang: str | None = None) -> str:
    """A step's (or advanced check's) ``title``, ``hint`` or ``goal`` in ``lang``."""
    return exercise_catalog(exercise).text(f"{_check_prefix(step)}.{field}", lang)
