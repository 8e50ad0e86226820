"""The engine knows no exercise and, outside harness/brokers/, no broker (issue 11): the import contracts
in pyproject.toml hold, can fail, cover every engine module, and the engine's code and texts name none
of the exercises, their application modules or the broker kinds."""
from __future__ import annotations

import importlib.util
import pkgutil
import re
import tomllib
from pathlib import Path

import pytest

import retrylab.brokers
from retrylab import exercise as exercises

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "harness"
_spec = importlib.util.spec_from_file_location("lint_imports", ROOT / "scripts" / "lint_imports.py")
lint_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lint_imports)
CONTRACTS = {c["id"]: c for c in
             tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]}


@pytest.fixture(scope="module")
def laid_out(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("lint")
    lint_imports.lay_out(folder)
    return folder


def test_every_contract_is_kept(laid_out):
    done = lint_imports.lint(laid_out, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in done.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("runner.py", "from retrylab.checks.backoff_dlq import lab", "engine-knows-no-exercise"),
    ("settle.py", "import retrylab.brokers.redis.keyspace", "engine-knows-no-broker"),
    ("reporters/text.py", "from retrylab.fixtures.backoff_dlq import corpus", "engine-knows-no-exercise"),
])
def test_an_engine_module_that_imports_an_exercise_or_a_broker_breaks_a_contract(tmp_path, module, line, contract):
    lint_imports.lay_out(tmp_path)
    target = tmp_path / "retrylab" / module
    target.write_text(target.read_text() + f"\n{line}\n")
    done = lint_imports.lint(tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert f"{CONTRACTS[contract]['name'].split(' (')[0]}" in " ".join(done.stdout.split())
    assert "BROKEN" in done.stdout


def _engine_modules(within_brokers: bool) -> set[str]:
    """The engine's modules and subpackages as the contracts name them (retrylab.x)."""
    found = {f"retrylab.{path.stem}" for path in HARNESS.glob("*.py") if path.stem != "__init__"}
    found |= {f"retrylab.{path.name}" for path in HARNESS.iterdir()
              if (path / "__init__.py").exists() and (within_brokers or path.name != "brokers")}
    return found


@pytest.mark.parametrize("contract, within_brokers", [("engine-knows-no-exercise", True),
                                                      ("engine-knows-no-broker", False)])
def test_the_contracts_name_every_engine_module(contract, within_brokers):
    missing = _engine_modules(within_brokers) - set(CONTRACTS[contract]["source_modules"])
    assert not missing, f"add to {contract} in pyproject.toml: {sorted(missing)}"


def _application_modules() -> set[str]:
    names = set()
    for exercise in exercises.exercises().values():
        if exercise.application:
            module, _, factory = exercise.application.partition(":")
            application = getattr(importlib.import_module(module), factory)()
            names.add(application.module)
    return names


def test_the_engine_outside_brokers_names_no_exercise_application_or_broker():
    names = set()
    for exercise in exercises.exercises().values():
        names |= {exercise.id, exercise.folder.name}
    names |= _application_modules()
    names |= {info.name for info in pkgutil.iter_modules(retrylab.brokers.__path__) if info.ispkg}
    assert "redis" in names and "backoff-dlq" in names and "taskproc" in names   # the scan is not empty
    pattern = re.compile("|".join(re.escape(n) for n in sorted(names)), re.IGNORECASE)
    hits = []
    for path in sorted(HARNESS.rglob("*")):
        if path.suffix not in (".py", ".toml") or "brokers" in path.relative_to(HARNESS).parts[:1]:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)
