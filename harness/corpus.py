"""An exercise's corpus of known-wrong and known-correct submissions, and the verdict each must get.

Each exercise's fixtures/<id>/corpus.py makes one `Corpus` of its submissions/ folder and its reference solution.

A corpus entry is a folder `submissions/<wrong|correct|hostile>/<name>/` holding `fixture.toml` and the
files in which it differs from its base (the reference solution, or nothing). Keeping only the
difference makes each entry say exactly what it changes.

fixture.toml:
    why = "the mistake it makes, or the legitimate variety it exercises"
    base = "reference"            # or "empty"
    remove = ["replay.py"]        # base files to delete (optional)
    [expect]                      # the verdict per lab step: "pass" or "fail"
    1 = "pass"
    ...
    [expect_advanced]             # optional: the verdict per advanced check (an [[advanced]] id of exercise.toml)
    non-blocking = "fail"
    ...

Hostile entries (`entries("hostile")`, never in `entries()`) attack the harness itself; two more keys:
    max_seconds = 60              # grading must finish within this (a correctness bound, not a speed target)
    keep_as = { "worker.py" = "reference_worker.py" }   # base files kept under another name (to run them)
    [generate]                    # files too big or too binary for the repository, made by materialize
    "schedule.txt" = { random_bytes = 5242880 }      # seeded random bytes
    "jitter.txt" = { text = "0.5\n", times = 100000 }  # a text repeated
"""
from __future__ import annotations

import random
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

_SKIP = {"fixture.toml", "__pycache__", "__init__.py"}


@dataclass(frozen=True)
class CorpusEntry:
    kind: str            # "wrong" or "correct"
    name: str
    folder: Path
    why: str
    base: str
    remove: tuple[str, ...]
    expect: dict[int, str]
    expect_advanced: dict[str, str] = field(default_factory=dict)   # advanced check id -> verdict; {}: not asserted
    max_seconds: float | None = None     # hostile entries: the bound on grading time
    generate: tuple[tuple[str, dict], ...] = ()
    keep_as: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"

    reference: Path | None = None        # the exercise's reference solution (base = "reference")

    def materialize(self, dest: Path) -> Path:
        """Write the full submission into `dest` (created) and return it."""
        dest.mkdir(parents=True, exist_ok=True)
        if self.base == "reference":
            _copy_tree(self.reference, dest)
        elif self.base != "empty":
            raise ValueError(f"{self.id}: unknown base {self.base!r}")
        for name, new_name in self.keep_as:
            shutil.copy2(dest / name, dest / new_name)
        for name in self.remove:
            target = dest / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        _copy_tree(self.folder, dest)
        for name, spec in self.generate:
            _generate(dest / name, spec, seed=f"{self.id}/{name}")
        return dest


def _generate(path: Path, spec: dict, seed: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if "random_bytes" in spec:
        path.write_bytes(random.Random(seed).randbytes(int(spec["random_bytes"])))
    elif "text" in spec:
        path.write_text(spec["text"] * int(spec.get("times", 1)), encoding="utf-8")
    else:
        raise ValueError(f"{path.name}: generate needs random_bytes or text")


def _copy_tree(src: Path, dest: Path) -> None:
    for path in src.iterdir():
        if path.name in _SKIP:
            continue
        if path.is_dir():
            shutil.copytree(path, dest / path.name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(*_SKIP))
        else:
            shutil.copy2(path, dest / path.name)


def load(folder: Path, reference: Path | None = None) -> CorpusEntry:
    meta = tomllib.loads((folder / "fixture.toml").read_text(encoding="utf-8"))
    expect = {int(step): verdict for step, verdict in meta["expect"].items()}
    expect_advanced = {str(check): verdict for check, verdict in meta.get("expect_advanced", {}).items()}
    if set(expect.values()) - {"pass", "fail"} or set(expect_advanced.values()) - {"pass", "fail"}:
        raise ValueError(f"{folder}: verdicts must be 'pass' or 'fail'")
    return CorpusEntry(kind=folder.parent.name, name=folder.name, folder=folder,
                       why=meta["why"], base=meta.get("base", "reference"),
                       remove=tuple(meta.get("remove", ())), expect=expect, expect_advanced=expect_advanced,
                       max_seconds=meta.get("max_seconds"),
                       generate=tuple(sorted(meta.get("generate", {}).items())),
                       keep_as=tuple(sorted(meta.get("keep_as", {}).items())), reference=reference)


@dataclass(frozen=True)
class Corpus:
    """One exercise's corpus: `submissions/<kind>/<name>/` folders, based on `reference`."""
    submissions: Path
    reference: Path

    def load(self, folder: Path) -> CorpusEntry:
        return load(folder, self.reference)

    def entries(self, kind: str | None = None) -> list[CorpusEntry]:
        """The entries of one kind; by default the correct and wrong ones (hostile ones only by name)."""
        kinds = [kind] if kind else ["correct", "wrong"]
        return [self.load(folder) for k in kinds if (self.submissions / k).is_dir()
                for folder in sorted((self.submissions / k).iterdir())
                if (folder / "fixture.toml").is_file()]
