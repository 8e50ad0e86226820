"""Grading a directory of submissions into a gradebook: in parallel, resumable, shardable.

Each submission is graded in its own process (`python -m retrylab.batch`, below), in its own
process group, with its own private server, so gradings cannot see each other and one that crashes
or hangs is stopped (SIGTERM, then SIGKILL) without stopping the batch: it gets a row with status
`error` and the reason.

Resuming: after each submission a record (submission id, content hash, grading configuration, row)
is appended to a journal next to the gradebook (`<gradebook>.state.jsonl`), as one `write` of one
line, so an interrupted batch loses at most the submissions being graded; a torn last line is
ignored. A re-run skips submissions whose content and configuration (harness version, exercise,
backend, step limit) are unchanged and whose row is a grade (pass/fail); errors are graded again.
At the end the journal is compacted (written to a temporary file, then renamed over it).

The gradings, the reasons of error rows, the feedback and the summary are in the batch's language
(`lang`, as `retrylab check --lang`); a row reused from the journal holds the feedback of its grading,
so the language is part of the configuration.

The feedback: a course author should not have to grade again to see why a step failed. The JSON
gradebook has, per submission, `feedback`: each step that did not pass (its column) and its whole
message; the CSV has a `feedback` column with the first line of each such message, cut to fit.

Gradebooks and the journal are written with the user's umask (a gradebook is shared with
colleagues and tools as any file the user writes would be). Whether both can be written is checked
before any grading (`check_writable`), not found out after the first one.

A submission's id is its folder's name as UTF-8 text; the bytes of a name that is not UTF-8 are written
`\\xNN` (a folder `bad<0xff>name` is `bad\\xffname`), in the gradebooks, the journal and the shard hash
alike, so a re-run knows it by the same id. Text from a grading (a message quoting such a path) is
written the same way: no gradebook or journal holds anything but UTF-8.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import dataclasses
import errno
import hashlib
import io
import json
import os
from select import select as _readable  # batch.select is the shard selection
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from retrylab import __version__, brokers, i18n, options, tempdirs
from retrylab import exercise as exercises
from retrylab.gradeworker import ForkedGrading, WarmPool, WarmUnavailable
from retrylab.reporters.bounds import neutral

STATE_SUFFIX = ".state.jsonl"
OVERHEAD = 30.0         # per-submission wall limit beyond its steps' limits: interpreter, backend, pytest
# The per-submission limit counts from when the grading process is up (its interpreter started and
# its imports done): on a busy machine starting an interpreter can take many seconds, which says
# nothing about the submission. Starting has a bound of its own, this generous.
START_LIMIT = 300.0
TERM_GRACE = 5.0        # after SIGTERM, time for a grading to stop its learner processes and servers
REASON_LIMIT = 300
FEEDBACK_LIMIT = 1000   # characters of the CSV's feedback column; the JSON gradebook has the whole messages
STEP_FEEDBACK_LIMIT = 200   # of one step's first line in that column
MESSAGE_LIMIT = 20000   # of one step's message in the JSON gradebook (a message can quote learner output)
# What the grader never sees (the sandbox does not copy it): it does not change a grade.
_UNSEEN = {"__pycache__", ".git"}
# Folders that hold tools' or editors' files, never a submission (hidden ones are skipped too).
_NOT_SUBMISSIONS = {"__pycache__", "node_modules", "venv", "env", "__MACOSX", "site-packages"}
# How JSON and CSV text is encoded: a lone surrogate left in it (a grading's report quotes the submission's path,
# which may not be UTF-8) becomes `\udcNN`, which in JSON is the escape of that same character and reads back as
# it, rather than a UnicodeEncodeError that loses the report or stops the batch.
UNENCODABLE = "backslashreplace"


@dataclass(frozen=True)
class Submission:
    id: str          # the subdirectory's name, readable(): what is not UTF-8 in it written as \xNN
    path: Path


@dataclass(frozen=True)
class BatchConfig:
    backend: str | None = None       # None: the exercise's broker's default backend (its name once made)
    exercise_id: str | None = None   # None: the default exercise (its id once made)
    step_timeout: float | None = None
    timeout: float | None = None     # per-submission wall limit; None: the steps' limits + OVERHEAD
    jobs: int = 1
    lang: str = i18n.DEFAULT         # of the reports and the reasons in the gradebook
    warm: bool = True                # fork gradings from warm processes (gradeworker); False: each one cold

    def __post_init__(self):
        if self.exercise_id is None:
            object.__setattr__(self, "exercise_id", exercises.default_id())
        if self.backend is None:
            object.__setattr__(self, "backend", options.chosen_backend(None, self.exercise))

    @property
    def exercise(self) -> exercises.Exercise:
        return exercises.get(self.exercise_id)

    def wall_limit(self) -> float:
        if self.timeout is not None:
            return self.timeout
        checks = self.exercise.steps + self.exercise.advanced
        return sum(self.step_timeout if self.step_timeout is not None else c.timeout for c in checks) + OVERHEAD

    def fingerprint(self) -> str:
        """What, besides a submission's content, decides its grade."""
        return json.dumps({"harness": __version__, "exercise": self.exercise_id, "backend": self.backend,
                           "step_timeout": self.step_timeout, "lang": self.lang}, sort_keys=True)


# -- which submissions ----------------------------------------------------------------------------

def discover(folder: Path) -> list[Submission]:
    """Every subdirectory of `folder` is a submission, sorted by name; hidden ones (`.git`, `.venv`)
    and tools' folders (`__pycache__`, `node_modules`, ...) excepted. The id is the name made readable():
    the same folder always has the same id, which the journal and the shards key on."""
    return [Submission(readable(p.name), p) for p in sorted(Path(folder).iterdir(), key=lambda p: p.name)
            if p.is_dir() and not p.name.startswith(".") and p.name not in _NOT_SUBMISSIONS]


def submission_files_in(folder: Path, exercise: exercises.Exercise) -> list[str]:
    """The files of a submission (those its steps read) that lie in `folder` itself: a folder
    holding them is one submission, not a folder of submissions."""
    from retrylab.commands.explain import step_files
    names = {name for step in exercise.steps for name in step_files(exercise, step)}
    return sorted(name for name in names if (Path(folder) / name).is_file())


def parse_shard(text: str) -> tuple[int, int]:
    """"I/N" (1 <= I <= N) -> (I, N)."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected I/N, e.g. 1/4") from None
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text}: I must be between 1 and N")
    return index, count


def shard_of(submission_id: str, count: int) -> int:
    """The shard (1..count) a submission belongs to: a hash of its name, so it stays in the same shard
    when other submissions are added or removed (and a shard's resume state stays valid)."""
    digest = hashlib.sha256(submission_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def select(submissions: Iterable[Submission], shard: tuple[int, int] | None) -> list[Submission]:
    if shard is None:
        return list(submissions)
    index, count = shard
    return [s for s in submissions if shard_of(s.id, count) == index]


def content_hash(folder: Path) -> str:
    """SHA-256 over every file's relative path and bytes (a symlink: its target), in sorted order."""
    h = hashlib.sha256()
    for path in sorted(_files(Path(folder)), key=lambda p: p.relative_to(folder).as_posix()):
        rel = path.relative_to(folder).as_posix().encode("utf-8", "surrogateescape")
        if path.is_symlink():
            h.update(b"L" + rel + b"\0" + os.readlink(path).encode("utf-8", "surrogateescape") + b"\0")
        else:
            h.update(b"F" + rel + b"\0" + str(path.stat().st_size).encode() + b"\0")
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
    return h.hexdigest()


def _files(folder: Path):
    for root, dirs, files in os.walk(folder):  # does not follow symlinked directories
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        dirs[:] = [d for d in dirs if d not in _UNSEEN and d not in links]
        for name in files + links:
            if name not in _UNSEEN:
                yield Path(root, name)


def readable(text: str) -> str:
    """`text` as UTF-8 can hold it: the bytes of a file name that are not UTF-8 (which Python keeps as lone
    surrogates) written `\\xNN`, any other lone surrogate `\\udNNN`; any other text unchanged."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that stands for no byte (e.g. from a JSON escape)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def os_reason(exc: OSError) -> str:
    """Why the system refused, to end a one-line message: `permission denied`."""
    reason = exc.strerror or str(exc)
    return reason[:1].lower() + reason[1:]


# -- the gradebook ----------------------------------------------------------------------------------

def step_column(step: exercises.Step) -> str:
    return f"step{step.number}_{step.slug}" if step.kind == exercises.LAB else f"advanced_{step.slug}"


def columns(exercise: exercises.Exercise) -> list[str]:
    return (["id", "status", "score"] + [step_column(s) for s in exercise.steps + exercise.advanced]
            + ["seconds", "harness_version", "backend", "reason", "feedback"])


def row_from_report(submission: Submission, report: dict, seconds: float, config: BatchConfig) -> dict:
    """A gradebook row from a Report (as a dict): pass/fail/error per step; the score is the sum of the
    weights of the lab steps that pass over the total weight (None when the grading is not complete)."""
    exercise = config.exercise
    results = {(r["number"] if r["kind"] == exercises.LAB else r["name"].removeprefix("advanced:")): r
               for r in report.get("results", ())}
    row = _blank_row(submission, seconds, config)
    row["harness_version"] = report.get("harness_version", __version__)
    feedback = {}
    for step in exercise.steps + exercise.advanced:
        result = results.get(step.number if step.kind == exercises.LAB else step.slug)
        row[step_column(step)] = result["status"] if result else ""
        if result and result["status"] != "pass" and result.get("message"):
            feedback[step_column(step)] = _bounded(result["message"], MESSAGE_LIMIT)
    row["feedback"] = feedback
    lab = [results.get(s.number) for s in exercise.steps]
    ungraded = [(s, r) for s, r in zip(exercise.steps, lab) if r is None or r["status"] == "error"]
    if report.get("harness_error"):
        row.update(status="error", reason=_one_line(report["harness_error"]))
    elif ungraded:
        step, result = ungraded[0]
        why = result["message"] if result else i18n.label("batch.did_not_run", config.lang)
        reason = i18n.label("batch.step_ungraded", config.lang, number=step.number, why=why)
        row.update(status="error", reason=_one_line(reason))
    else:
        total = sum(s.weight for s in exercise.steps)
        earned = sum(s.weight for s, r in zip(exercise.steps, lab) if r["status"] == "pass")
        row.update(status="pass" if earned == total else "fail",
                   score=round(earned / total, 4) if total else 1.0)
    return row


def error_row(submission: Submission, reason: str, seconds: float, config: BatchConfig) -> dict:
    row = _blank_row(submission, seconds, config)
    row.update(status="error", reason=_one_line(reason))
    return row


def _blank_row(submission: Submission, seconds: float, config: BatchConfig) -> dict:
    row = dict.fromkeys(columns(config.exercise), "")
    row.update(id=submission.id, score=None, seconds=round(seconds, 2), harness_version=__version__,
               backend=config.backend, feedback={})
    return row


def _one_line(text: str, limit: int = REASON_LIMIT) -> str:
    return " ".join(readable(str(text)).split())[:limit]


def _bounded(text: str, limit: int) -> str:
    text = readable(text)   # a message may quote a path that is not UTF-8
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def feedback_cell(feedback: dict) -> str:
    """The CSV's cut version of a row's feedback: `column: first line` per step, `|` between steps."""
    if not isinstance(feedback, dict):
        return ""
    # a cell is read in a spreadsheet or a terminal: learner control characters shown escaped
    parts = [f"{column}: {_one_line(neutral(message).strip().splitlines()[0] if message.strip() else '', STEP_FEEDBACK_LIMIT)}"
             for column, message in feedback.items()]
    return _bounded(" | ".join(parts), FEEDBACK_LIMIT)


# What a spreadsheet reads as the start of a formula (=HYPERLINK(...), -2+3, @SUM(...)), or a cell's tab or CR
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """A CSV cell: text (a submission's id is its folder's name, which a learner may choose) with control characters
    shown escaped (an ESC sequence for the grader's terminal; a lone CR, which the csv module leaves unquoted, split
    the row in two for readers) and, where a spreadsheet would take it for a formula, kept as text by a leading
    apostrophe. Numbers as they are."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return value
    text = neutral(readable(value))
    return "'" + text if text.startswith(_FORMULA_START) else text


def json_gradebook(out: Path) -> bool:
    """Whether the gradebook at `out` is JSON (its ids as they are); else CSV (each id a csv_cell)."""
    return Path(out).suffix.lower() == ".json"


def write_gradebook(out: Path, rows: list[dict], config: BatchConfig) -> None:
    out = Path(out)
    if json_gradebook(out):
        data = {"exercise": config.exercise_id, "backend": config.backend, "harness_version": __version__,
                "columns": columns(config.exercise), "submissions": rows}
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    else:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns(config.exercise), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            cells = {k: csv_cell(v) for k, v in row.items() if k in writer.fieldnames}
            cells["feedback"] = feedback_cell(row.get("feedback"))
            writer.writerow(cells)
        text = buffer.getvalue()
    _write_atomically(out, text)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())   # mkstemp's 0600 is for the temporary name, not for the file
        with os.fdopen(fd, "w", encoding="utf-8", errors=UNENCODABLE, newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_writable(out: Path) -> None:
    """The gradebook can be written (a temporary file in its folder, renamed over it) and its journal read and
    appended to: said before any grading, not as a traceback after the first one. ValueError: one line, why not."""
    out = Path(out)
    try:
        _create_and_remove_a_file_in(out.parent, prefix=f".{out.name}.")
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot create files in {out.parent}: {os_reason(exc)}") from None
    journal = state_path(out)
    try:
        _open_journal_once(journal)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot read and append to its journal {journal}: {os_reason(exc)}") from None


def _create_and_remove_a_file_in(folder: Path, prefix: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=folder)
    os.close(fd)
    os.unlink(tmp)


def _open_journal_once(journal: Path) -> None:
    """Open the journal as BatchState and record() will; one this creates is removed again, so that a batch
    refused later (say, for its backend) leaves nothing behind."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT
    try:
        os.close(os.open(journal, flags | os.O_EXCL, 0o666))
    except FileExistsError:
        os.close(os.open(journal, flags, 0o666))
    else:
        os.unlink(journal)


# -- resume state -----------------------------------------------------------------------------------

class BatchState:
    """The journal next to the gradebook: the latest record per submission."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.records: dict[str, dict] = {}
        try:
            journal = self.path.read_bytes()
        except FileNotFoundError:
            journal = b""
        # a torn last line (a crash, a full disk) gets a line end before the next record, which it would spoil
        self._torn = not journal.endswith(b"\n") and journal != b""
        for line in journal.split(b"\n"):
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn line from an interrupted write
            if _well_formed(record):  # else a foreign or corrupt line: its submission is graded again
                self.records[record["id"]] = record

    def reusable(self, submission: Submission, digest: str, config: BatchConfig) -> dict | None:
        record = self.records.get(submission.id)
        if digest.startswith("unreadable"):
            return None
        if (record and record.get("hash") == digest and record.get("config") == config.fingerprint()
                and record["row"].get("status") in ("pass", "fail")):
            return record["row"]
        return None

    def record(self, submission: Submission, digest: str, config: BatchConfig, row: dict) -> None:
        record = {"id": submission.id, "hash": digest, "config": config.fingerprint(), "row": row}
        self.records[submission.id] = record
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", UNENCODABLE)
        if self._torn:
            line = b"\n" + line
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)   # less the umask
        try:
            # one write of one line: a crash leaves whole lines and maybe one torn one. A write the disk could
            # only take part of is a torn line, not a grade recorded: said, as a full disk
            self._torn = True
            if os.write(fd, line) != len(line):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
            os.fsync(fd)
            self._torn = False
        finally:
            os.close(fd)

    def compact(self, keep: Iterable[str]) -> None:
        kept = [self.records[i] for i in sorted(set(keep)) if i in self.records]
        _write_atomically(self.path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
        self._torn = False


def _well_formed(record) -> bool:
    """A record as record() writes it, as far as reading it back depends on."""
    return isinstance(record, dict) and isinstance(record.get("id"), str) and isinstance(record.get("row"), dict)


# -- grading one submission in its own process ------------------------------------------------------

class _Running:
    """The grading processes in flight, so that Ctrl-C on the batch stops them all."""

    def __init__(self):
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self.cancelled = False

    def add(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.add(proc)
            if self.cancelled:
                _stop(proc)

    def discard(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.discard(proc)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            procs = list(self._procs)
        for proc in procs:
            _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the grading (it stops its learner processes and its servers), SIGKILL its group after."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=TERM_GRACE)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def grade_in_subprocess(submission: Submission, config: BatchConfig, workdir: Path,
                        running: _Running | None = None, warm: WarmPool | None = None) -> dict:
    """Grade one submission in a process of its own (forked by a warm process of `warm` when one is
    there, else a cold `python -m retrylab.batch`); always returns a row (status `error` with the reason
    when the grading dies, fails to report, or outlives the per-submission wall limit)."""
    running = running or _Running()
    result = workdir / f"{hashlib.sha256(submission.id.encode()).hexdigest()[:16]}.json"
    errlog = result.with_suffix(".stderr")
    argv = [str(submission.path), str(result), "--backend", config.backend, "--exercise", config.exercise_id,
            "--lang", config.lang]
    if config.step_timeout is not None:
        argv += ["--step-timeout", repr(config.step_timeout)]
    limit = config.wall_limit()
    started = time.monotonic()
    proc, not_started = _forked(warm, argv, errlog), False
    if proc is not None:
        running.add(proc)
    else:
        proc, not_started = _started_cold(argv, errlog, running)
    timed_out = False
    try:
        if not_started:
            raise subprocess.TimeoutExpired(argv, START_LIMIT)
        proc.wait(timeout=limit)
        with contextlib.suppress(ProcessLookupError):  # anything it left behind in its group
            os.killpg(proc.pid, signal.SIGKILL)
    except subprocess.TimeoutExpired:
        timed_out = not not_started
        _stop(proc)
    finally:
        running.discard(proc)
    seconds = time.monotonic() - started
    lang = config.lang  # labels are given it: this runs in a pool's thread, outside the caller's i18n.use
    if running.cancelled:
        return error_row(submission, i18n.label("batch.interrupted", lang), seconds, config)
    if not_started:
        return error_row(submission, i18n.label("batch.not_started", lang, limit=START_LIMIT), seconds, config)
    if timed_out:
        return error_row(submission, i18n.label("batch.wall_limit", lang, limit=limit), seconds, config)
    try:
        report = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return error_row(submission, _no_report(proc.returncode, _tail(errlog), lang), seconds, config)
    return row_from_report(submission, report, seconds, config)


def _forked(warm: WarmPool | None, argv: list[str], errlog: Path) -> ForkedGrading | None:
    """The grading forked by this thread's warm process; None when there is none to fork it."""
    worker = warm.worker() if warm is not None else None
    if worker is None:
        return None
    try:
        return worker.start(argv, str(errlog), START_LIMIT)
    except WarmUnavailable:
        return None


def _started_cold(argv: list[str], errlog: Path, running: _Running) -> tuple[subprocess.Popen, bool]:
    """A cold `python -m retrylab.batch` (in `running` from the start), and whether it failed to come up
    within START_LIMIT."""
    ready_r, ready_w = os.pipe()
    with errlog.open("wb") as err:
        try:
            proc = subprocess.Popen([sys.executable, "-m", "retrylab.batch", *argv, "--ready-fd", str(ready_w)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True, pass_fds=(ready_w,))
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
    running.add(proc)
    with open(ready_r, "rb") as ready:  # a byte once it is up; EOF if it exits first
        not_started = not _readable([ready], [], [], START_LIMIT)[0]
    return proc, not_started


def _no_report(returncode: int, tail: str, lang: str) -> str:
    """Why a grading process gave no report: how it ended, and the last line it wrote to stderr."""
    if returncode < 0:
        reason = i18n.label("batch.killed", lang, signal=signal.Signals(-returncode).name)
    else:
        reason = i18n.label("batch.exited", lang, status=returncode)
    return i18n.label("batch.detail", lang, reason=reason, detail=tail) if tail else reason


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - limit))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# -- the batch --------------------------------------------------------------------------------------

@dataclass
class BatchSummary:
    rows: list[dict]
    graded: int = 0
    reused: int = 0
    errors: int = 0
    seconds: float = 0.0
    interrupted: bool = False


def state_path(out: Path) -> Path:
    return Path(out).with_name(Path(out).name + STATE_SUFFIX)


def run_batch(submissions: list[Submission], config: BatchConfig, out: Path, *,
              on_start: Callable[[int, int], None] = lambda total, reused: None,
              on_done: Callable[[dict], None] = lambda row: None,
              known: Iterable[str] | None = None) -> BatchSummary:
    """Grade `submissions` (reusing unchanged grades from the state journal), write the gradebook. The journal
    keeps the records of `known` (default: `submissions`): every submission in the batch folder, for a shard, so
    that shards sharing one gradebook do not drop each other's grades (each was graded again on its next run)."""
    started = time.monotonic()
    state = BatchState(state_path(out))
    rows: dict[str, dict] = {}
    todo: list[tuple[Submission, str]] = []
    for submission in submissions:
        try:
            digest = content_hash(submission.path)
        except OSError as exc:  # unreadable: grade it anyway (the grading will say what it can)
            digest = f"unreadable: {exc}"
        row = state.reusable(submission, digest, config)
        if row is not None:
            rows[submission.id] = row
        else:
            todo.append((submission, digest))
    summary = BatchSummary(rows=[], reused=len(rows))
    on_start(len(submissions), len(rows))
    running = _Running()
    workdir = tempdirs.make("batch")
    with contextlib.ExitStack() as cleanup, \
            concurrent.futures.ThreadPoolExecutor(max_workers=config.jobs) as pool:
        cleanup.callback(tempdirs.remove_tree, workdir)
        warm = (WarmPool(config.exercise_id, config.backend, START_LIMIT, lang=config.lang)
                if config.warm and todo else None)
        if warm is not None:
            cleanup.callback(warm.close)    # after the pool's threads are done (the ExitStack unwinds last)
        futures = {pool.submit(grade_in_subprocess, s, config, workdir, running, warm): (s, d) for s, d in todo}
        not_recorded = None
        try:
            for future in concurrent.futures.as_completed(futures):
                submission, digest = futures[future]
                try:
                    row = future.result()
                except Exception as exc:  # a harness defect in the batch itself: one row, not the batch
                    row = error_row(submission, i18n.label("batch.crashed", config.lang, error=repr(exc)), 0.0, config)
                rows[submission.id] = row
                try:
                    state.record(submission, digest, config, row)
                except OSError as exc:    # a disk filling up: grading on would only lose more grades
                    not_recorded = exc
                    _stop_all(futures, running)
                    break
                summary.graded += 1
                summary.errors += row["status"] == "error"
                on_done(row)
        except KeyboardInterrupt:
            summary.interrupted = True
            _stop_all(futures, running)
    if not_recorded is not None:
        raise GradesNotSaved(i18n.label("batch.not_recorded", config.lang, journal=state.path,  # reused ones too
                                        reason=os_reason(not_recorded), graded=summary.graded + summary.reused))
    summary.rows = [rows[s.id] for s in submissions if s.id in rows]
    try:   # the gradebook first: the journal, with every step's whole feedback, is the larger of the two
        write_gradebook(out, summary.rows, config)
        if not summary.interrupted:
            state.compact(known if known is not None else (s.id for s in submissions))
    except OSError as exc:
        raise GradesNotSaved(i18n.label("batch.not_written", config.lang, out=out, reason=os_reason(exc),
                                        journal=state.path)) from None
    summary.seconds = time.monotonic() - started
    return summary


class GradesNotSaved(Exception):
    """The journal or the gradebook could not be written (a full disk): the batch stopped, and says what is kept."""


def _stop_all(futures, running: _Running) -> None:
    """No grading queued starts, and those running are stopped (Ctrl-C, or grades that can no longer be saved)."""
    for future in futures:
        future.cancel()
    running.cancel()


# -- the child: `python -m retrylab.batch SUBMISSION RESULT.json` -----------------------------------

def interrupt(signum, frame):
    # Unwind like Ctrl-C: pytest stops, fixtures and sandboxes clean up (learner processes, servers).
    raise KeyboardInterrupt


def child_main(argv: list[str] | None = None) -> int:
    parser = options.argument_parser(prog="python -m retrylab.batch",
                                     description="grade one submission for `retrylab grade-batch`")
    parser.add_argument("submission", type=Path)
    parser.add_argument("result", type=Path, help="where to write the report as JSON")
    for option in (options.EXERCISE, options.backend_option(), options.STEP_TIMEOUT, options.LANG):
        option.add_to(parser)
    parser.add_argument("--ready-fd", type=int, help="write a byte here once up: the wall limit starts then")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, interrupt)
    from retrylab.grading import grade
    if args.ready_fd is not None:
        os.write(args.ready_fd, b"1")
        os.close(args.ready_fd)
    exercise = exercises.get(args.exercise)
    try:
        # before any thread: forked from a warm process, this grading may then fork its servers too
        brokers.start_early(exercise.broker, options.chosen_backend(args.backend, exercise), fork_servers=True)
        report = grade(args.submission, backend=args.backend, exercise_id=exercise.id,
                       step_timeout=args.step_timeout, lang=i18n.resolve(args.lang))
    finally:
        brokers.stop_unused()
    _write_atomically(args.result, json.dumps(dataclasses.asdict(report), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
