"""The suite does not depend on the order its tests run in: scripts/randomly_seeds.sh runs all of it
under 20 pytest-randomly seeds (too long for every run). Here, two seeds of a fast subset whose tests
share module state (the sandbox's measured containment, the readers' raise-on-bug switch), in a
pytest of its own so the seed is ours to choose."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBSET = ["tests/test_sandbox.py",
          "tests/test_fuzz_redis_values.py::test_what_a_script_sent_is_read_without_fail",
          "tests/test_backoff_dlq_parsing.py::test_decode_json_never_raises",
          "tests/test_backoff_dlq_parsing.py::test_decode_json_round_trips_json"]


@pytest.mark.parametrize("seed", [1234, 98765])
def test_a_fast_subset_passes_in_a_random_order(seed):
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "randomly", f"--randomly-seed={seed}",
                           "-p", "no:xdist", *SUBSET], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"Using --randomly-seed={seed}" in done.stdout and " passed" in done.stdout.splitlines()[-1]
