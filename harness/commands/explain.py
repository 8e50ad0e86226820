"""`retrylab explain N`: what step N asks, the formulas it relies on, and its hint, in the learner's
language. Without N: the steps, one line each.

Everything comes from the exercise: exercise.toml (titles, hints, `formulas` per step and the
[formulas] table of code) and its locales/ catalogs (goals, what each formula means, translations).
"""
from __future__ import annotations

from retrylab import exercise as exercises
from retrylab import bidi, i18n, options
from retrylab.commands import UsageError, add_options, chosen_exercise, write_stdout

INDENT = "  "


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "explain", help="explain a step: its goal, the formulas it relies on and the hint",
        description="Explain step N of the exercise: what it asks, the formulas it relies on, the hint.")
    parser.add_argument("step", nargs="?", metavar="N",
                        help="the step number, or an advanced check's id (none: list the steps)")
    add_options(parser, options.EXERCISE, options.LANG)


def step_files(exercise: exercises.Exercise, step: exercises.Step) -> tuple[str, ...]:
    """The learner files a step reads (exercise.toml: its `files`, else its `file`)."""
    return step.files


def find_step(exercise: exercises.Exercise, wanted: str) -> exercises.Step:
    for step in exercise.steps:
        if wanted.strip() in (str(step.number), step.slug):
            return step
    for check in exercise.advanced:
        if wanted.strip() in (check.slug, f"advanced:{check.slug}"):
            return check
    numbers = [s.number for s in exercise.steps]
    raise UsageError(i18n.label("explain.unknown", step=wanted, exercise=exercise.id,
                                first=min(numbers), last=max(numbers)))


def explain(exercise: exercises.Exercise, step: exercises.Step, lang: str) -> str:
    """The explanation of one step, as printed."""
    catalog = i18n.exercise_catalog(exercise)
    prefix = f"steps.{step.slug}" if step.number is not None else f"advanced.{step.slug}"
    title = catalog.text(f"{prefix}.title", lang)
    if step.number is not None:
        heading = i18n.label("explain.heading", lang, number=step.number, title=title)
    else:
        heading = i18n.label("explain.heading_advanced", lang, name=step.slug, title=title)
    lines = [heading, ""]
    if catalog.has(f"{prefix}.goal"):
        lines += [i18n.label("explain.goal", lang), INDENT + catalog.text(f"{prefix}.goal", lang), ""]
    code = exercise.formulas
    names = [name for name in step.formulas if name in code]
    if names:
        lines.append(i18n.label("explain.formulas", lang))
        for name in names:
            lines.append(i18n.ltr_lines(INDENT + code[name], lang))
            if catalog.has(f"formulas.{name}"):
                lines.append(INDENT * 2 + catalog.text(f"formulas.{name}", lang))
        lines.append("")
    lines += [i18n.label("explain.hint", lang), INDENT + catalog.text(f"{prefix}.hint", lang)]
    files = step_files(exercise, step)
    if files:
        lines += ["", i18n.label("explain.files", lang, files=", ".join(files))]
    return "\n".join(lines) + "\n"


def index(exercise: exercises.Exercise, lang: str) -> str:
    """One line per step (and advanced check), for `retrylab explain` without N."""
    catalog = i18n.exercise_catalog(exercise)
    lines = [i18n.label("explain.index", lang, exercise=exercise.id, title=catalog.text("title", lang)), ""]
    for step in exercise.steps:
        lines.append(f"{INDENT}{i18n.label('report.step', lang, number=step.number)}: "
                     f"{catalog.text(f'steps.{step.slug}.title', lang)}")
    for check in exercise.advanced:
        lines.append(f"{INDENT}advanced:{check.slug}: {catalog.text(f'advanced.{check.slug}.title', lang)}")
    lines += ["", i18n.label("explain.index_more", lang)]
    return "\n".join(bidi.balance(line) for line in lines) + "\n"


def run(args) -> int:
    lang = i18n.resolve(args.lang)
    exercise = chosen_exercise(args)
    with i18n.use(lang):
        if args.step is None:
            write_stdout(index(exercise, lang))
            return 0
        step = find_step(exercise, args.step)
        write_stdout(explain(exercise, step, lang))
    return 0
