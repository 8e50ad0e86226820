"""Check the import contracts of pyproject.toml ([tool.importlinter]) with import-linter.

import-linter (grimp) finds a package's modules by walking its folder, and `retrylab` is several
folders mapped into one package (pyproject's package-dir: harness/ is `retrylab`, checks/ is
`retrylab.checks`, ...): walking harness/ alone would miss the exercises. So the package is laid out
as installed, in a temporary folder (copies, no build), and lint-imports reads it from there.

    python scripts/lint_imports.py      # exit status: lint-imports' (0: every contract kept)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "submissions")


def lay_out(target: Path) -> None:
    """The package folders as an installed wheel has them, under `target`."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
        destination = target.joinpath(*package.split("."))
        if destination.exists():
            shutil.rmtree(destination)      # a deeper mapping replaces what its parent's copy put there
        shutil.copytree(ROOT / folder, destination, ignore=IGNORED)


def lint(folder: Path, **run) -> subprocess.CompletedProcess:
    """lint-imports on the package laid out in `folder`."""
    env = dict(os.environ, PYTHONPATH=str(folder))
    command = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(command) if command.exists() else "lint-imports", str(ROOT / "pyproject.toml"),
                           "--no-cache"], env=env, cwd=folder, **run)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="retrylab-lint-") as folder:
        lay_out(Path(folder))
        return lint(Path(folder)).returncode


if __name__ == "__main__":
    sys.exit(main())
