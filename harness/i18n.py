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

    [step8.dlq_left]
    plural = "count"
    one = "{dlq} still holds {count} entry ..."
    other = "{dlq} still holds {count} entries ..."

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
(a learner's stray U+202E would otherwise reverse the rest of a report line), and truncation never
cuts an isolate open. :func:`bidi_problems` checks that a text is balanced.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
import string
import tomllib
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

LANGUAGES = ("en", "zh", "ru", "fa")
DEFAULT = "en"
RTL = frozenset({"fa"})
NAMES = {"en": "English", "zh": "中文", "ru": "Русский", "fa": "فارسی"}
# Precedence as in GNU gettext: LANGUAGE (a colon-separated list) first, then the locale.
LOCALE_VARIABLES = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")
ENGINE_LOCALES = Path(__file__).resolve().parent / "locales"

# CLDR plural categories each language's plural messages must give.
PLURAL_FORMS = {"en": ("one", "other"), "zh": ("other",), "ru": ("one", "few", "many"), "fa": ("other",)}

LRE, RLE, PDF, LRO, RLO = "\u202a", "\u202b", "\u202c", "\u202d", "\u202e"
LRI, RLI, FSI, PDI = "\u2066", "\u2067", "\u2068", "\u2069"
LRM = "\u200e"
_EMBEDDINGS = frozenset(LRE + RLE + LRO + RLO)
_ISOLATES = frozenset(LRI + RLI + FSI)
BIDI_CONTROLS = frozenset(LRE + RLE + PDF + LRO + RLO + LRI + RLI + FSI + PDI)
_ANY_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
# Paragraph separators of the bidi algorithm: each ends the scope of every open control.
_PARAGRAPHS = re.compile(r"(\r\n|[\n\r\x1c-\x1e\x85\u2029])")


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
# bidi: isolating left-to-right fragments, keeping controls balanced


def _lines(text: str) -> list[str]:
    """``text`` split into lines and the separators between them (kept, at odd indices)."""
    return _PARAGRAPHS.split(text)


def _unbalanced(line: str) -> list[int]:
    """Indices of the bidi controls in one line that open or close nothing (strict nesting)."""
    stack: list[tuple[int, bool]] = []  # (index, is_isolate)
    bad: list[int] = []
    for index, char in enumerate(line):
        if char in _EMBEDDINGS:
            stack.append((index, False))
        elif char in _ISOLATES:
            stack.append((index, True))
        elif char == PDF:
            if stack and not stack[-1][1]:
                stack.pop()
            else:
                bad.append(index)
        elif char == PDI:
            if any(is_isolate for _, is_isolate in stack):
                while True:  # an isolate's end also ends the embeddings left open inside it
                    opened, is_isolate = stack.pop()
                    if is_isolate:
                        break
                    bad.append(opened)
            else:
                bad.append(index)
    bad.extend(index for index, _ in stack)
    return sorted(bad)


def bidi_problems(text: str) -> list[str]:
    """A description of each bidi control in ``text`` that is not matched within its line."""
    problems = []
    parts = _lines(text)
    for number, line in enumerate(parts[::2], start=1):
        if not BIDI_CONTROLS.intersection(line):
            continue
        for index in _unbalanced(line):
            problems.append(f"line {number}, column {index + 1}: unmatched U+{ord(line[index]):04X}")
    return problems


def balance(text: str) -> str:
    """``text`` with each unmatched bidi control shown as an escape (``\\u202e``) instead."""
    if not _ANY_BIDI.search(text):
        return text
    parts = _lines(text)
    for i in range(0, len(parts), 2):
        line = parts[i]
        bad = set(_unbalanced(line)) if BIDI_CONTROLS.intersection(line) else ()
        if bad:
            parts[i] = "".join(f"\\u{ord(c):04x}" if j in bad else c for j, c in enumerate(line))
    return "".join(parts)


def isolate(text: str) -> str:
    """Each line of ``text`` (its indentation and trailing spaces left outside) as a first-strong
    isolate, so that it is laid out on its own inside a right-to-left line."""
    parts = _lines(text)
    for i in range(0, len(parts), 2):
        line = parts[i]
        core = line.strip(" ")
        if core:
            start = line.index(core[0])
            parts[i] = f"{line[:start]}{FSI}{core}{PDI}{line[start + len(core):]}"
    return "".join(parts)


# A run of Latin text: printable ASCII words joined by spaces, holding a letter or a digit.
_LTR_RUN = re.compile(r"[!-~]+(?: +[!-~]+)*")
_ALNUM = re.compile(r"[A-Za-z0-9]")
_SENTENCE = ".,:;!?"
_PAIRS = {")": "(", "]": "[", "}": "{"}
_OPENERS = {o: c for c, o in _PAIRS.items()}


def _trim(run: str) -> tuple[str, str, str]:
    """(lead, core, tail): sentence punctuation and unmatched brackets at a run's ends belong to
    the surrounding right-to-left sentence, not to the fragment."""
    lead, tail = "", ""
    while run:
        last = run[-1]
        if last in _SENTENCE or last == " " or (last in _PAIRS and run.count(last) > run.count(_PAIRS[last])):
            tail, run = last + tail, run[:-1]
        else:
            break
    while run:
        first = run[0]
        if first in _SENTENCE or first == " " or (first in _OPENERS and run.count(first) > run.count(_OPENERS[first])):
            lead, run = lead + first, run[1:]
        else:
            break
    return lead, run, tail


def _edges_would_split(value: str) -> bool:
    """True for a substituted Latin value whose first or last character a run's trimming would leave
    to the sentence: `../x`, `.hidden/w.py`, `(x`. A value is one thing, so it is isolated whole."""
    if "\n" in value or not _ALNUM.search(value):
        return False
    lead, _, tail = _trim(value)
    return bool(lead or tail)


def has_rtl(text: str) -> bool:
    return any(unicodedata.bidirectional(c) in ("R", "AL") for c in text if ord(c) > 0x58F)


def _sentences(run: str) -> list[str]:
    """``run`` cut after each sentence punctuation mark that is followed by a space and not inside
    brackets: "8: jitter" is two fragments, "random.uniform(0, 8)" one."""
    pieces, start, depth = [], 0, 0
    for index, char in enumerate(run):
        if char in _OPENERS:
            depth += 1
        elif char in _PAIRS:
            depth = max(0, depth - 1)
        elif char in _SENTENCE and depth == 0 and run[index + 1:index + 2] == " ":
            pieces.append(run[start:index + 1])
            start = index + 1
    pieces.append(run[start:])
    return pieces


def isolate_latin_runs(text: str) -> str:
    """``text`` (right-to-left prose) with each run of Latin text in it (code, file names, numbers,
    ``attempt=3``, ``6/8``, ``random.uniform(0, 8)``) isolated as one block. Runs that already are
    an isolate's whole content are left as they are."""
    def wrap(match: re.Match) -> str:
        if match.start() and text[match.start() - 1] in _ISOLATES and text[match.end():match.end() + 1] == PDI:
            return match.group()
        out = []
        for piece in _sentences(match.group()):
            lead, core, tail = _trim(piece)
            out.append(f"{lead}{FSI}{core}{PDI}{tail}" if _ALNUM.search(core) else piece)
        return "".join(out)

    return _LTR_RUN.sub(wrap, text)


def ltr_lines(text: str, lang: str | None = None) -> str:
    """``text`` (e.g. a plot) laid out left to right line by line even in a right-to-left report: in
    a right-to-left language each line starts with LEFT-TO-RIGHT MARK, the strong character from
    which a terminal takes the line's direction."""
    if (lang or current()) not in RTL:
        return text
    return "\n".join(LRM + line if line.strip() else line for line in text.split("\n"))


def width(text: str) -> int:
    """Columns a terminal gives ``text``: wide CJK characters take two, marks and controls none."""
    columns = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) == "Cf":
            continue
        columns += 2 if unicodedata.east_asian_width(char) in "WF" else 1
    return columns


def pad(text: str, columns: int) -> str:
    """``text`` followed by spaces up to ``columns`` terminal columns (labels in a column)."""
    return text + " " * max(0, columns - width(text))


def truncate(text: str, limit: int, ellipsis: str = "\u2026") -> str:
    """``text`` cut to at most ``limit`` characters, ending in ``ellipsis``, with every isolate or
    embedding the cut left open closed again."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(ellipsis))
    while True:
        head = text[:keep]
        last_line = _lines(head)[-1]
        stack = []
        for char in last_line:
            if char in _EMBEDDINGS or char in _ISOLATES:
                stack.append(char)
            elif char == PDF and stack and stack[-1] in _EMBEDDINGS:
                stack.pop()
            elif char == PDI and any(c in _ISOLATES for c in stack):
                while stack.pop() not in _ISOLATES:
                    pass
        closers = "".join(PDI if c in _ISOLATES else PDF for c in reversed(stack))
        if keep + len(ellipsis) + len(closers) <= limit or keep == 0:
            return head + ellipsis + closers
        keep -= len(closers)
        keep = max(0, keep)


def bounded(text: str, limit: int, ellipsis: str = "\u2026") -> str:
    """``text`` within ``limit`` characters, a limit set for English: translations (and Persian's
    isolates) run longer, so other languages get half as much again."""
    if current() != DEFAULT:
        limit += limit // 2
    return truncate(text, limit, ellipsis)


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
        return balance(template.format_map(params))
    out = []
    for literal, name, spec, conversion in _parse(template):
        out.append(literal)
        if name is None:
            continue
        value = params[name]
        if conversion:
            value = {"r": repr, "s": str, "a": ascii}[conversion](value)
        text = balance(format(value, spec) if spec else str(value))
        out.append(isolate(text) if has_rtl(text) or _edges_would_split(text) else text)
    return isolate_latin_runs("".join(out))


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


class Catalog:
    """One folder of message files. ``english`` adds English texts kept elsewhere (an exercise's
    step titles and hints)."""

    def __init__(self, directory: Path, english: Mapping[str, str] | None = None):
        self.directory = Path(directory)
        self.messages: dict[str, dict[str, Message]] = {}
        for lang in LANGUAGES:
            path = self.directory / f"{lang}.toml"
            found: dict[str, Message] = {}
            if path.is_file():
                _flatten(tomllib.loads(path.read_text(encoding="utf-8")), "", found, path)
            self.messages[lang] = found
        self.external = frozenset(english or ())
        for key, text in (english or {}).items():
            self.messages["en"][key] = Message(key, {"other": _literal(text)})

    def has(self, key: str, lang: str = DEFAULT) -> bool:
        return key in self.messages.get(lang, {})

    def text(self, key: str, lang: str | None = None, /, **params) -> str:
        """The message ``key`` in ``lang`` (default: the current language), filled from ``params``.
        A key missing in ``lang`` falls back to English (tests forbid that); unknown: KeyError."""
        lang = lang or current()
        message = self.messages.get(lang, {}).get(key)
        if message is None:
            message, lang = self.messages[DEFAULT].get(key), DEFAULT
            if message is None:
                raise KeyError(f"no message {key!r} in {self.directory}")
        return render(message.template(lang, params), lang, params)

    def problems(self) -> list[str]:
        """Everything that keeps this catalog from being complete and consistent."""
        found = []
        english = self.messages[DEFAULT]
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


def _show(fields: set) -> str:
    return "{" + ", ".join(sorted(n + (f":{s}" if s else "") + (f"!{c}" if c else "") for n, s, c in fields)) + "}"


@functools.cache
def catalog(directory: Path | str) -> Catalog:
    return Catalog(Path(directory).resolve())


def translator(directory: Path | str) -> Callable[..., str]:
    """``tr(key, **params)``: the message in the current language from the catalog in ``directory``,
    loaded on first use."""
    loaded: list[Catalog] = []

    def tr(key: str, /, **params) -> str:
        if not loaded:
            loaded.append(catalog(directory))
        return loaded[0].text(key, **params)
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
