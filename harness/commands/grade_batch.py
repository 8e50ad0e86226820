"""`retrylab grade-batch DIR`: grade every submission in DIR into a gradebook (CSV or JSON)."""
from __future__ import annotations

import contextlib
import signal
from pathlib import Path

from retrylab import i18n, options
from retrylab.reporters.bounds import neutral
from retrylab.commands import UsageError, add_options, check_seconds, chosen_exercise, given_path, probe_backend
from retrylab.commands.check import check_output_path, require_isolation

FORMATS = (".csv", ".json")


def register(subparsers) -> None:
    batch = subparsers.add_parser(
        "grade-batch", help="grade every submission in a directory into a gradebook (CSV or JSON)",
        description="Every subdirectory of DIR (hidden and tool folders such as __pycache__ excepted) is one"
                    " submission, graded in its own process with its own "
                    "private server (backends that name a shared server are not offered). Re-running skips submissions that are unchanged since they were graded "
                    "(a state file sits next to the gradebook), so an interrupted batch resumes. Exit status: "
                    "0 the batch completed (whatever the grades), 2 bad arguments or grades that can no longer be "
                    "saved (a full disk), 130 interrupted.")
    batch.add_argument("directory", type=given_path, metavar="DIR",
                       help="a directory with one subdirectory per submission")
    batch.add_argument("--out", type=given_path, default=Path("gradebook.csv"), metavar="PATH",
                       help="the gradebook: .csv or .json (default: gradebook.csv)")
    batch.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                       help="grade N submissions at a time, each in its own process (default: 1)")
    add_options(batch, options.EXERCISE, options.backend_option())
    batch.add_argument("--shard", metavar="I/N",
                       help="grade only shard I of N (a stable split by name hash, for CI matrices)")
    batch.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="wall limit per submission (default: the sum of its steps' limits + 30 s)")
    batch.add_argument("--cold", action="store_true",
                       help="start every grading as a fresh interpreter, not forked from a warm process that "
                            "did the imports and the containment probe once (slower; the grades are the same)")
    add_options(batch, options.STEP_TIMEOUT, options.ISOLATION, options.LANG)


def validate(args) -> tuple[tuple[int, int] | None, list]:
    """The shard asked for and every submission in the batch folder, once the arguments are known to be usable
    (else UsageError)."""
    from retrylab import batch
    with _reading(args.directory):
        if not args.directory.is_dir():
            raise UsageError(f"{args.directory} is not a directory")
    _check_gradebook_path(args.out)
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    check_seconds("--timeout", args.timeout)
    check_seconds("--step-timeout", args.step_timeout)
    try:
        shard = batch.parse_shard(args.shard) if args.shard is not None else None   # '' is refused, not all
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    exercise = chosen_exercise(args)
    everyone = _check_submissions(args.directory, exercise, args.out)
    _check_gradebook_outside(args.out, everyone)
    probe_backend(args, exercise, private=True)  # one line, exit 2, before anything is graded
    require_isolation(args.isolation, exercise)
    _check_gradebook_writable(args.out)   # last: it creates (and removes) files, which bad arguments should not
    return shard, everyone


@contextlib.contextmanager
def _reading(directory: Path):
    """The system refusing to show what is in `directory` (its mode, say) is one line, not a traceback."""
    from retrylab import batch
    try:
        yield
    except OSError as exc:
        raise UsageError(f"cannot read {directory}: {batch.os_reason(exc)}") from None


def _check_gradebook_path(out: Path) -> None:
    from retrylab import batch
    if out.suffix.lower() not in FORMATS:
        raise UsageError(f"--out {out}: the gradebook is written as .csv or .json")
    try:
        check_output_path(out, "--out")   # a missing directory is refused, never created
    except OSError as exc:  # a folder on the way that this user may not look into
        raise UsageError(f"--out {out}: {batch.os_reason(exc)}") from None


def _check_gradebook_writable(out: Path) -> None:
    """The gradebook and its journal can be written: said now, not as a traceback after the first grading."""
    from retrylab import batch
    try:
        batch.check_writable(out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _check_submissions(directory: Path, exercise, out: Path) -> list:
    """`directory` holds submissions, each with an id of its own in the gradebook: those submissions."""
    from retrylab import batch
    with _reading(directory):
        own_files = batch.submission_files_in(directory, exercise)
        submissions = batch.discover(directory)
    if own_files:
        raise UsageError(f"{directory} looks like one submission (it holds {', '.join(own_files)}): grade it"
                         f" with `retrylab check {directory}`, or give grade-batch the directory that holds"
                         " one subdirectory per submission")
    if not submissions:
        raise UsageError(f"no submission in {directory}: grade-batch grades each of its subdirectories"
                         " (hidden and tool folders such as __pycache__ are skipped)")
    # a name that is not UTF-8 is written with \xNN escapes, which another name may spell out; and the CSV
    # gradebook escapes control characters and puts an apostrophe before a formula (`=x` and `'=x` are one cell)
    readings = [lambda s: s.id] + ([] if batch.json_gradebook(out) else [lambda s: batch.csv_cell(s.id)])
    for id_of in readings:
        first: dict[str, Path] = {}
        for submission in submissions:
            other = first.setdefault(id_of(submission), submission.path)
            if other != submission.path:
                raise UsageError(f"the folders {_named(other)} and {_named(submission.path)} in {directory} would "
                                 f"both be {neutral(id_of(submission))} in the gradebook: rename one")
    return submissions


def _named(folder: Path) -> str:
    """A folder's name told apart from any other: quoted, with what cannot be shown escaped, a backslash too (the
    ids of `a<ESC>b` and `a\\x1bb` are the same)."""
    return repr(folder.name)


def _check_gradebook_outside(out: Path, submissions: list) -> None:
    """The gradebook and its journal are in no submission's folder: every run of that learner's code would get a
    copy of the class's grades, and the submission would change with each grading (never reused on resume)."""
    where = out.resolve().parent
    for submission in submissions:
        if where.is_relative_to(submission.path.resolve()):
            raise UsageError(f"--out {out} is inside the submission {submission.id}: its scripts would get the "
                             "class's grades; write the gradebook outside every submission's folder")


def run(args) -> int:
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from retrylab import batch
    shard, everyone = validate(args)   # the folder listed once: what was checked is what is graded
    lang = i18n.resolve(args.lang)
    config = batch.BatchConfig(backend=args.backend, exercise_id=args.exercise, step_timeout=args.step_timeout,
                               timeout=args.timeout, jobs=args.jobs, lang=lang,
                               warm=not args.cold)
    submissions = batch.select(everyone, shard)
    console = Console(stderr=True)
    errors_column = i18n.label("batch.errors", lang, errors="{task.fields[errors]}")  # rich fills it in
    progress = Progress(TextColumn(i18n.label("batch.progress", lang)), BarColumn(), MofNCompleteColumn(),
                        TextColumn(errors_column), TimeElapsedColumn(),
                        TextColumn("ETA"), TimeRemainingColumn(), console=console)
    task = progress.add_task("grading", total=len(submissions), errors=0)
    errors = 0

    def started(total: int, reused: int) -> None:
        progress.reset(task, total=total, completed=reused, errors=0)  # the ETA's rate: this run's gradings

    def done(row: dict) -> None:
        nonlocal errors
        errors += row["status"] == "error"
        progress.update(task, advance=1, errors=errors)

    # a CI job being cancelled (SIGTERM), like Ctrl-C: stop the gradings in flight, keep what is done
    previous = signal.signal(signal.SIGTERM, batch.interrupt)
    try:
        with progress:
            summary = batch.run_batch(submissions, config, args.out, on_start=started, on_done=done,
                                      known=[s.id for s in everyone])
    except batch.GradesNotSaved as exc:
        raise UsageError(str(exc)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    where = i18n.label("batch.shard", lang, shard=args.shard) if shard else ""
    console.print(i18n.label("batch.summary", lang, count=len(summary.rows), shard=where, graded=summary.graded,
                             reused=summary.reused, errors=summary.errors, seconds=summary.seconds,
                             out=str(args.out)), highlight=False, soft_wrap=True, markup=False)
    if summary.interrupted:
        console.print(i18n.label("batch.resume", lang), highlight=False)
        return 130
    return 0
