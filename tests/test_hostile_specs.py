"""The hostile-spec corpus (tests/bad_specs/): every file is refused by `orchestrator
submit` with exit 2 and one line on stderr, no traceback, and no database file or any other
file written; plus the bounds that accept (merge keys, --max-trials) and the warnings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import spec as specs
from orchestrator.cli import main

CORPUS = Path(__file__).parent / "bad_specs"
FILES = sorted(CORPUS.glob("*.yaml"))

GOOD = """
name: t
fixed: {task: mqar, task.K: 8, arm: armed_gdn, d_model: 16, n_layers: 1}
axes:
  seed: 0..2
budget: {steps: 20, eval_every: 10}
"""


def test_corpus_size():
    assert len(FILES) >= 80


def _refused(code: int, err: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_bad_spec_is_refused_and_writes_nothing(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "sub" / "o.db"
    code = main(["submit", str(path), "--db", str(db), "-q"])
    out = capsys.readouterr()
    _refused(code, out.err)
    assert out.out == ""
    assert list(tmp_path.iterdir()) == []  # no database, no runs/ folder, nothing


@pytest.mark.parametrize("name", ["three_axes_of_1000", "latin1", "nested_list_5000", "seed_2_pow_70"])
def test_bad_spec_through_a_real_process(name, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "submit", str(CORPUS / f"{name}.yaml"), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_deep_nesting_and_size_generated(tmp_path, capsys):
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: t\nfixed: " + "[" * 50_000 + "]" * 50_000 + "\n")
    big = tmp_path / "big.yaml"
    big.write_text(GOOD + "#" * (2 << 20) + "\n")
    for p in (deep, big):
        code = main(["submit", str(p), "--dry-run"])
        _refused(code, capsys.readouterr().err)


def test_cap_counts_before_materialising_and_max_trials_raises_it(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text(GOOD.replace("seed: 0..2", "seed: 0..2\n  eval_seed: 0..3"))
    code = main(["submit", str(p), "--dry-run", "--max-trials", "11"])
    err = capsys.readouterr().err
    _refused(code, err)
    assert "12 combinations" in err and "--max-trials" in err
    code = main(["submit", str(p), "--dry-run", "--max-trials", "12", "--json"])
    out = capsys.readouterr()
    assert code == 0 and '"trials": 12' in out.out


def test_yaml_merge_keys_are_defaults_that_written_keys_override():
    text = GOOD.replace("budget:", "resources:\n  <<: {cpu: 2, gpu: 0}\n  cpu: 1\nbudget:")
    sw = specs.load(text=text)
    assert sw.spec.resources.cpu == 1 and sw.spec.resources.gpu == 0
    with pytest.raises(specs.SpecError, match="duplicate key 'cpu'"):
        specs.load(text=text.replace("  cpu: 1\n", "  cpu: 1\n  cpu: 3\n"))


def test_exclude_matching_nothing_warns(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text(GOOD + "exclude: [{seed: 7}]\n")
    code = main(["submit", str(p), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 0 and "exclude[0]" in err and "matches no combination" in err
    assert len(specs.load(p).trials) == 3


def test_password_in_storage_is_redacted_and_warned(tmp_path, capsys):
    text = GOOD + "storage: 'postgresql://orch:hunter2-secret@127.0.0.1:5432/test'\n"
    sw = specs.load(text=text)
    assert "hunter2-secret" not in sw.text and "orch:***@127.0.0.1" in sw.text
    assert sw.spec.storage and "hunter2-secret" in sw.spec.storage  # still usable to connect
    assert any("PGPASSFILE" in w for w in sw.warnings)
    assert specs.load(text=text).hash == sw.hash  # stable: re-submits match


def test_node_memory_bound_is_stated(monkeypatch):
    monkeypatch.setenv("ORCH_NODE_MEMORY_BYTES", str(10**5))
    with pytest.raises(specs.SpecError, match=r"largest node.s 0.0001 GB"):
        specs.load(text=GOOD)
    monkeypatch.delenv("ORCH_NODE_MEMORY_BYTES")
    assert len(specs.load(text=GOOD).trials) == 3


def test_every_checked_in_sweep_still_loads():
    root = Path(__file__).parents[1] / "sweeps"
    for p in sorted(root.glob("*.yaml")):
        assert specs.load(p).trials, p
    assert os.environ.get("ORCH_NODE_MEMORY_BYTES") is None
