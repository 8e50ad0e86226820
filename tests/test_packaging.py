"""A built wheel carries everything `retrylab check` needs outside the source tree."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from retrylab.fixtures.backoff_dlq import corpus

NEEDED = [
    "retrylab/learner_site/pythonpath/sitecustomize.py",
    "retrylab/fixtures/backoff_dlq/taskproc.py",
    "retrylab/checks/pytest.ini",
    "retrylab/checks/backoff_dlq/exercise.toml",
    "retrylab/solution/backoff_dlq/worker.py",
    "retrylab/solution/backoff_dlq/schedule.txt",
    "retrylab/locales/fa.toml",
    "retrylab/checks/backoff_dlq/locales/fa.toml",
]


def test_wheel_ships_the_learner_site_checks_fixtures_and_solution(tmp_path):
    # build from a copy: setuptools writes build/ and *.egg-info next to the sources
    source = tmp_path / "source"
    shutil.copytree(corpus.FIXTURES.parent.parent, source, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", ".venv*", ".tox", "__pycache__", ".hypothesis", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("retrylab-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in NEEDED if name not in names]
    assert not missing, missing
    fixture_files = [n for n in names if n.startswith("retrylab/fixtures/backoff_dlq/submissions/") and n.endswith("fixture.toml")]
    assert len(fixture_files) == len(corpus.entries()) + len(list((corpus.SUBMISSIONS / "hostile").glob("*/fixture.toml")))
