"""The import contracts in pyproject.toml hold for the tree, and each one that guards a layer
fails when a deliberate violation is put into a copy of the tree (so a contract that stopped
checking anything would be noticed)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs lint-imports in subprocesses

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("orchestrator", "cells", "tasks", "kernels")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT), "--no-cache", "--no-logo", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("tree")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


def test_the_tree_keeps_every_contract(tree_copy):
    r = _lint(tree_copy)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "0 broken" in r.stdout


@pytest.mark.parametrize(
    "module, line, contract",
    [
        ("orchestrator/ui/app.py", "import orchestrator.runner.sweep", "layers"),
        ("orchestrator/store/engine.py", "import orchestrator.ui.db", "layers"),
        ("orchestrator/analysis/data.py", "import orchestrator.spec", "layers"),
        ("orchestrator/train/loop.py", "import sqlalchemy", "training loop"),
        ("orchestrator/runner/writer.py", "import sqlalchemy", "runner writes no SQL"),
        ("cells/family.py", "import orchestrator.status", "never import orchestrator"),
    ],
    ids=["ui->runner", "store->ui", "analysis->spec", "train->sqlalchemy", "runner->sqlalchemy", "cells->orchestrator"],
)
def test_a_deliberate_violation_breaks_its_contract(tree_copy, module, line, contract):
    path = tree_copy / module
    original = path.read_text()
    try:
        path.write_text(original + f"\n{line}  # deliberate violation\n")
        r = _lint(tree_copy)
    finally:
        path.write_text(original)
    assert r.returncode != 0, r.stdout[-2000:]
    assert any(contract in name for name in _broken(r.stdout)), r.stdout[-3000:]


def _broken(stdout: str) -> list[str]:
    """The names of the contracts the report marks BROKEN (it wraps long names)."""
    text = " ".join(stdout.split())
    section = text.split("Analyzed", 1)[-1].split("Contracts:", 1)[0]
    parts = re.split(r" (KEPT|BROKEN)\b", section)
    return [
        parts[i].split("dependencies. -", 1)[-1].strip(" -")
        for i in range(0, len(parts) - 1, 2)
        if parts[i + 1] == "BROKEN"
    ]
