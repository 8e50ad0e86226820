"""`retrylab watch DIR`: grade a submission, then again each time a file in it changes.

For a learner iterating on their own machine: save a file, see the verdict. Changes are debounced
(an editor's save is often several writes); the steps that read a changed file (each step's
`file`/`files` in exercise.toml) are re-checked first, so their verdict shows at once, then the rest. Each time, the screen is cleared
(when it is a terminal) and a compact summary is redrawn: N/8 steps pass, a line for each failing
step, the first failing step's message (wrapped at spaces to the terminal's width, never inside a
word or a bidi isolate), and a line for the advanced checks. The rest of the steps are graded with
the advanced checks in one full grading. Editors' temporary files (sed -i's `sedXXXXXX`, vim's swap
files and `4913`, emacs' `#x#`, backups `x~`) are not changes. Ctrl-C (or SIGTERM) stops it
cleanly: a grading in progress is interrupted, the learner's processes it started are stopped, and
it exits with status 0.
"""
from __future__ import annotations

import os
import queue
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from retrylab import exercise as exercises
from retrylab import bidi, i18n, options, procfs
from retrylab.commands import (UsageError, add_options, chosen_exercise, given_path, probe_backend,
                               write_stdout)
from retrylab.commands.explain import step_files
from retrylab.reporters.bounds import neutral

CLEAR = "\x1b[H\x1b[2J"
SEPARATOR = "-" * 60
MESSAGE_LINES = 14          # lines of the first failing step's message shown in the summary
# Editors' and tools' temporary files, beyond those watchfiles' DefaultFilter knows (swap files, x~, .#x)
EDITOR_TEMPORARIES = (r"^sed[A-Za-z0-9]{6}$", r"^4913$", r"^#.*#$", r"\.(tmp|temp|bak|orig|rej)$",
                      r"^\.goutputstream-", r"\.kate-swp$", r"^\.~lock\.", r"\.crdownload$")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "watch", help="grade a submission again each time a file in it changes",
        description="Grade DIR, then re-grade it whenever a file in it changes (Ctrl-C to stop).")
    parser.add_argument("directory", type=given_path, help="the learner's submission directory")
    add_options(parser, options.EXERCISE, options.backend_option())
    parser.add_argument("--debounce", type=int, default=300, metavar="MS",
                        help="quiet time after a change before grading, in milliseconds (default: 300)")
    parser.add_argument("--clear", choices=("auto", "always", "never"), default="auto",
                        help="clear the screen before each summary (default: auto, when stdout is a terminal)")
    add_options(parser, options.LANG)


class _Stop(Exception):
    pass


class Watcher:
    """The latest result of every step, and the summary drawn from them."""

    def __init__(self, args, exercise: exercises.Exercise, lang: str, out=None):
        self.args = args
        self.exercise = exercise
        self.lang = lang
        self.out = out if out is not None else sys.stdout
        if self.out is None:    # started with descriptor 1 closed: nothing could be shown (OutputError says so)
            write_stdout("")
        self.results: dict[int, object] = {}
        self.advanced: tuple = ()     # the advanced checks' results of the last full grading
        self.stale: set[int] = set()
        self.changed: list[str] = []
        self.error = ""               # why the last grading could not grade everything, if so
        self.clear = args.clear == "always" or (args.clear == "auto" and self.out.isatty())
        self.stopping = threading.Event()

    # -- grading -------------------------------------------------------------------------------

    def order(self, changed: list[str]) -> tuple[list[int], list[int]]:
        """(steps that read a changed file, the other steps), each in step order."""
        names = {Path(c).name for c in changed} | set(changed)
        first = [s.number for s in self.exercise.steps if names & set(step_files(self.exercise, s))]
        rest = [s.number for s in self.exercise.steps if s.number not in first]
        return first, rest

    def grade(self, numbers: list[int], *, full: bool = False) -> None:
        """Grade `numbers`; `full`: every step and the advanced checks (the summary says `numbers`)."""
        if not numbers:
            return
        from retrylab.grading import grade  # imports pytest: keep --help fast
        if not self.args.directory.is_dir():
            # removed or renamed while watched: every step a "harness defect" from then on, the summary stale
            raise UsageError(f"{self.args.directory} is no longer a directory: nothing left to watch")
        self.draw(checking=numbers, advanced=full)
        report = grade(self.args.directory, backend=self.args.backend, steps=() if full else tuple(numbers),
                       exercise_id=self.exercise.id, lang=self.lang)
        if self.stopping.is_set() or report.interrupted:  # our KeyboardInterrupt, as pytest reported it
            raise _Stop
        for result in report.lab_results:
            self.results[result.number] = result
            self.stale.discard(result.number)
        if full:
            self.advanced = report.advanced_results
        self.error = report.harness_error
        self.draw()

    def regrade(self, changed: list[str]) -> None:
        self.changed = changed
        first, rest = self.order(changed)
        self.stale = set(self.results)
        self.grade(first)
        self.grade(rest, full=True)   # the steps just graded again too: the advanced checks need a full grading

    # -- the summary ---------------------------------------------------------------------------

    def summary(self, checking: list[int] | None = None, advanced: bool = False) -> list[str]:
        lang = self.lang
        lines = [i18n.label("watch.watching", lang, directory=str(self.args.directory))]
        if self.changed:
            lines.append(i18n.label("watch.changed", lang, files=", ".join(self.changed)))
        lines.append("")
        steps = self.exercise.steps
        known = [self.results[s.number] for s in steps if s.number in self.results]
        if known:
            passed = sum(r.passed for r in known)
            lines.append(i18n.label("watch.tally", lang, passed=passed, total=len(steps)))
            failing = [r for r in known if not r.passed]
            if not failing and len(known) == len(steps):
                lines.append(i18n.label("watch.all_pass", lang))
            for index, result in enumerate(failing):   # every failing step, a line each
                mark = i18n.label(f"report.{result.status}", lang)
                label = i18n.label("report.step", lang, number=result.number)
                earlier = f" {i18n.label('watch.earlier', lang)}" if result.number in self.stale else ""
                lines.append(f"{mark} {label}: {result.title}{earlier}")
                if index == 0:   # what to fix next, in full
                    message = [part for line in neutral(result.message).split("\n")   # not at a learner's CR
                               for part in wrap(line, self.columns() - 4)]
                    lines.extend("    " + line for line in message[:MESSAGE_LINES])
                    if len(message) > MESSAGE_LINES:
                        lines.append("    ...")
        if self.advanced:
            names = ", ".join(r.name.removeprefix("advanced:") for r in self.advanced if not r.passed)
            lines.append(i18n.label("watch.advanced_failing" if names else "watch.advanced", lang,
                                    passed=sum(r.passed for r in self.advanced), total=len(self.advanced),
                                    names=names))
        if self.error:
            lines.append(i18n.label("report.could_not_grade", lang, error=neutral(self.error)))
        if checking:
            lines += ["", i18n.label("watch.checking", lang, steps=", ".join(map(str, checking)))]
            if advanced:
                lines.append(i18n.label("watch.checking_advanced", lang))
        return [bidi.balance(line) for line in lines]

    def columns(self) -> int:
        return max(40, shutil.get_terminal_size((100, 24)).columns)

    def draw(self, checking: list[int] | None = None, advanced: bool = False) -> None:
        text = "\n".join(self.summary(checking, advanced)) + "\n"
        write_stdout((CLEAR if self.clear else SEPARATOR + "\n") + text, self.out)


def _words(line: str) -> list[str]:
    """`line` cut at its spaces, but none inside a bidi isolate (a Persian line's Latin run)."""
    words, current, depth = [], "", 0
    for char in line:
        if char in (bidi.LRI, bidi.RLI, bidi.FSI):
            depth += 1
        elif char == bidi.PDI and depth:
            depth -= 1
        if char == " " and depth == 0:
            words.append(current)
            current = ""
        else:
            current += char
    words.append(current)
    return words


def _cut_wide(word: str, columns: int) -> list[str]:
    """A word wider than a line (Chinese has no spaces): cut between characters, never inside an isolate."""
    if bidi.width(word) <= columns or any(c in bidi.BIDI_CONTROLS for c in word):
        return [word]
    pieces, current = [], ""
    for char in word:
        if current and bidi.width(current + char) > columns:
            pieces.append(current)
            current = ""
        current += char
    return pieces + [current]


def wrap(line: str, columns: int) -> list[str]:
    """`line` in lines of at most `columns` terminal columns, broken at spaces (a terminal would
    break mid-word); a continuation keeps the line's indentation."""
    if bidi.width(line) <= columns:
        return [line]
    indent = line[:len(line) - len(line.lstrip(" "))]
    room = max(10, columns - len(indent))
    lines, current = [], ""
    for word in _words(line.lstrip(" ")):
        for piece in _cut_wide(word, room):
            candidate = f"{current} {piece}" if current else piece
            if current and bidi.width(candidate) > room:
                lines.append(current)
                candidate = piece
            current = candidate
    lines.append(current)
    return [indent + part for part in lines]


def submission_filter():
    """watchfiles' default filter (caches, VCS folders, swap files) and editors' other temporaries."""
    import watchfiles

    class SubmissionFilter(watchfiles.DefaultFilter):
        ignore_entity_patterns = watchfiles.DefaultFilter.ignore_entity_patterns + EDITOR_TEMPORARIES

    return SubmissionFilter()


def is_editor_temporary(name: str) -> bool:
    return not submission_filter()(None, os.path.join(os.sep, "x", name))


class ChangeFeed:
    """Changes in a directory, watched by a thread from before the first grading on: what changes
    while a grading runs is kept and handed over, merged, when it is done."""

    def __init__(self, directory: Path, debounce_ms: int, stop: threading.Event):
        self.directory = directory
        self.debounce_ms = debounce_ms
        self.stop = stop
        self.armed = threading.Event()
        self.batches: queue.Queue = queue.Queue()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._watch, name="retrylab-watch", daemon=True)

    def start(self, limit: float = 10.0) -> None:
        self.thread.start()
        self.armed.wait(limit)  # the watcher is set up: no change from now on is missed

    def _watch(self) -> None:
        import watchfiles

        try:
            # rust_timeout + yield_on_timeout: an empty batch soon after the watch is set up (armed),
            # and the stop event is seen at least that often
            for changes in watchfiles.watch(self.directory, debounce=max(1600, self.debounce_ms * 4),
                                            step=self.debounce_ms, stop_event=self.stop, rust_timeout=100,
                                            yield_on_timeout=True, raise_interrupt=False,
                                            watch_filter=submission_filter()):
                self.armed.set()
                names = {os.path.relpath(path, self.directory) for _, path in changes}
                if names:
                    self.batches.put(names)
        except BaseException as exc:  # noqa: BLE001 - reported by next() in the main thread
            self.failure = exc
        finally:
            self.armed.set()
            self.batches.put(None)

    def next(self) -> list[str] | None:
        """The files changed since the last call (waiting for a change); None when watching ended."""
        while not self.stop.is_set():
            try:
                batch = self.batches.get(timeout=0.2)
            except queue.Empty:
                continue
            if batch is None:
                if self.failure is not None:
                    raise UsageError(f"cannot watch {self.directory}: {self.failure}")
                return None
            while True:  # everything that changed meanwhile, as one
                try:
                    more = self.batches.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self.batches.put(None)
                    break
                batch |= more
            return sorted(batch)
        return None


def _children() -> list[int]:
    """Process ids whose parent is this process (Linux /proc; [] elsewhere)."""
    return procfs.children(os.getpid())


def _stop_children(grace: float = 2.0) -> None:
    """Whatever grading left running (it should leave nothing): SIGTERM, then SIGKILL."""
    children = _children()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in children:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while children and time.monotonic() < deadline:
            for pid in list(children):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    children.remove(pid)
            time.sleep(0.05)
        if not children:
            return


def run(args) -> int:
    directory = args.directory
    if not directory.is_dir():
        raise UsageError(f"{directory} is not a directory")
    if args.debounce < 0:
        raise UsageError(f"--debounce {args.debounce}: give a number of milliseconds, 0 or more")
    args.directory = directory.resolve()
    lang = i18n.resolve(args.lang)
    exercise = chosen_exercise(args)
    probe_backend(args, exercise, private=True)  # one line and exit 2 now rather than a failed grading later
    watcher = Watcher(args, exercise, lang)

    def on_signal(signum, frame):
        watcher.stopping.set()
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    feed = ChangeFeed(args.directory, args.debounce, watcher.stopping)
    try:
        with i18n.use(lang):
            feed.start()
            watcher.grade([s.number for s in exercise.steps], full=True)
            while (changed := feed.next()) is not None:
                watcher.regrade(changed)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        watcher.stopping.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        feed.thread.join(timeout=5)
        _stop_children()
    write_stdout(i18n.label("watch.stopped", lang, directory=str(args.directory)) + "\n")
    return 0
