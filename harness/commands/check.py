"""`retrylab check DIR`: grade a submission hermetically and report."""
from __future__ import annotations

import os
from pathlib import Path

from retrylab import i18n, options
from retrylab.entry import say
from retrylab.commands import (UsageError, add_options, broker_settings, chosen_exercise, probe_backend,
                               check_seconds, given_path, start_early, write_stdout)
from retrylab.reporters import FORMATS, github
from retrylab.reporters.bounds import neutral


def register(subparsers) -> None:
    check = subparsers.add_parser("check", help="grade a submission directory hermetically")
    check.add_argument("directory", type=given_path, help="the learner's submission directory")
    add_options(check, options.EXERCISE, options.backend_option(), *options.broker_options(), options.STEP,
                options.STEP_TIMEOUT, options.ISOLATION)
    check.add_argument("--format", default="text", choices=sorted(FORMATS))
    check.add_argument("--output", type=given_path, metavar="PATH", help="write the report here instead of stdout")
    check.add_argument("--exit-zero", action="store_true",
                       help="exit 0 whatever the grading found (failed steps, a harness error while grading);"
                            " bad arguments still exit 2 and an interruption 130")
    check.add_argument("--strict", action="store_true", help="advanced checks count toward the exit status too")
    add_options(check, options.LANG)


def validate(args):
    """The exercise to grade, once the arguments are known to be usable (else UsageError)."""
    if not args.directory.is_dir():
        raise UsageError(f"{args.directory} is not a directory")
    if args.output is not None:
        check_output_path(args.output, "--output")
    check_seconds("--step-timeout", args.step_timeout)
    exercise = chosen_exercise(args)
    known = {s.number for s in exercise.steps}
    unknown = sorted(set(args.step) - known)
    if unknown:
        raise UsageError(f"no step {unknown[0]} in {exercise.id} (steps are {min(known)}-{max(known)})")
    # Fail fast, with one line, when the backend cannot work here (e.g. its server program missing).
    probe_backend(args, exercise)
    start_early(args, exercise)     # the servers start while the rest is imported and collected
    require_isolation(args.isolation, exercise)
    return exercise


def require_isolation(isolation: str, exercise) -> None:
    from retrylab import brokers
    from retrylab.sandbox import isolation_problem
    problem = isolation_problem(isolation, brokers.get(exercise.broker).learner_imports)
    if problem:
        raise UsageError(problem)


def check_output_path(path: Path, option: str) -> None:
    """A report file can be written at `path`: said before grading, in one line, not as a traceback
    after it (CI reads a traceback's exit status 1 as "a lab step failed")."""
    if path.is_dir():
        raise UsageError(f"{option} {path} is a directory: name a file")
    if not path.parent.is_dir():
        why = (f"{path.parent} is a file, not a directory" if path.parent.exists()
               else f"the directory {path.parent} does not exist")
        raise UsageError(f"{option} {path}: {why}")


def write_report(rendered: str, output: Path | None, *, machine: bool = False) -> None:
    """`machine`: a report for a program (exercism, gradescope, junit), in UTF-8 on stdout too."""
    if output is None:
        write_stdout(rendered, utf8=machine)
        return
    try:
        output.write_text(rendered, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--output {output}: {exc.strerror or exc}") from None


def _nothing_graded(report) -> bool:
    """The harness stopped before judging any step (e.g. a backend that could not start)."""
    return bool(report.harness_error) and not report.interrupted and all(r.status == "error" for r in report.results)


def run(args) -> int:
    from retrylab import brokers
    try:
        exercise = validate(args)
        from retrylab.grading import grade  # imports pytest: keep --help and usage errors fast
        report = grade(args.directory, backend=args.backend, steps=tuple(args.step), exercise_id=exercise.id,
                       step_timeout=args.step_timeout, lang=i18n.resolve(args.lang), **broker_settings(args, exercise))
    finally:
        brokers.stop_unused()
    if os.environ.get("GITHUB_ACTIONS") == "true":
        # Annotations on stderr (the runner reads workflow commands there too): stdout keeps only the
        # report. Written first, so that they are in before any text the report quotes.
        annotations = github.render(report, str(Path(report.submission).resolve()))
        if annotations:
            say(annotations.rstrip("\n"))
    # The machine formats are always written (a runner reads its file); a text report of steps none
    # of which was judged would only repeat the one line below, so the line is all there is then.
    status = report.exit_status(strict=args.strict)
    lost = None
    if args.format != "text" or args.output or not _nothing_graded(report):
        try:
            write_report(FORMATS[args.format](report), args.output, machine=args.format != "text")
        except UsageError as exc:   # the report could not be written: said after what the grading itself says
            lost = exc
    if status in (2, 130):
        reason = report.harness_error or "the harness failed on a step (see the report)"
        say(f"retrylab: {neutral(' '.join(reason.split()))}")
    if status == 130:
        return status   # an interruption is not a verdict: --exit-zero does not hide it, nor a lost report
    if lost is not None:
        raise lost
    return 0 if args.exit_zero else status
