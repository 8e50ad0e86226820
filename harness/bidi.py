"""Text for a terminal that implements the Unicode bidirectional algorithm, and its width in columns.

A right-to-left line (Persian) that holds left-to-right fragments (file names, code, numbers, quoted
learner text) is reordered by the terminal: each fragment is kept one block by wrapping it in FIRST
STRONG ISOLATE ... POP DIRECTIONAL ISOLATE (`isolate`, `isolate_latin_runs`, `isolate_value`). A
learner's stray control (U+202E) would reverse the rest of a report line: `balance` neutralises the
controls that open or close nothing, and `truncate` never cuts an isolate open. `width` and `pad`
count columns as a terminal does (CJK characters take two). Nothing here depends on the language:
retrylab.i18n decides when to apply it.
"""
from __future__ import annotations

import re
import unicodedata

LRE, RLE, PDF, LRO, RLO = "\u202a", "\u202b", "\u202c", "\u202d", "\u202e"
LRI, RLI, FSI, PDI = "\u2066", "\u2067", "\u2068", "\u2069"
LRM = "\u200e"
_EMBEDDINGS = frozenset(LRE + RLE + LRO + RLO)
_ISOLATES = frozenset(LRI + RLI + FSI)
BIDI_CONTROLS = frozenset(LRE + RLE + PDF + LRO + RLO + LRI + RLI + FSI + PDI)
_ANY_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
# Paragraph separators of the bidi algorithm: each ends the scope of every open control.
_PARAGRAPHS = re.compile(r"(\r\n|[\n\r\x1c-\x1e\x85\u2029])")


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


def isolate_value(text: str) -> str:
    """A value substituted into a right-to-left line: isolated whole if it holds right-to-left text
    or trimming its ends would leave some of it to the sentence, else as it is."""
    return isolate(text) if has_rtl(text) or _edges_would_split(text) else text


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
