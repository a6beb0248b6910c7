"""Sweep specs: expansion, stable keys, and one clear line for every kind of bad spec."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import spec as specs
from orchestrator.cli import main
from orchestrator.keys import trial_key

GOOD = """
name: t
fixed:
  task: mqar
  task.K: 8
  d_model: 16
  n_layers: 1
axes:
  arm: [gated_deltanet, armed_gdn]
  lr: [1e-3, 3.0e-3]
  seed: 0..2
budget: {steps: 20, eval_every: 10}
"""


def test_expansion_counts_axes_and_keys():
    sw = specs.load(text=GOOD)
    assert len(sw.trials) == 2 * 2 * 3
    assert sw.axes == {"arm": ["gated_deltanet", "armed_gdn"], "lr": [0.001, 0.003], "seed": [0, 1, 2]}
    keys = [k for k, _ in sw.trials]
    assert len(set(keys)) == len(keys)
    for key, params in sw.trials:
        assert key == trial_key(params)
        assert params["steps"] == 20 and params["task.K"] == 8
        assert params["schedule"] == "constant"  # defaults are part of the resolved config


def test_same_spec_same_keys_and_more_seeds_add_only_new_trials():
    a = specs.load(text=GOOD)
    b = specs.load(text=GOOD)
    assert [k for k, _ in a.trials] == [k for k, _ in b.trials]
    c = specs.load(text=GOOD.replace("seed: 0..2", "seed: 0..4"))
    old, new = {k for k, _ in a.trials}, {k for k, _ in c.trials}
    assert old < new and len(new - old) == 2 * 2 * 2


def test_zip_exclude_and_blocks():
    text = """
name: z
fixed: {task: mqar, arm: armed_gdn, d_model: 16, steps: 10, eval_every: 5}
axes:
  batch_size: [4, 8, 16]
  steps: [60, 40, 30]
  lr: [1e-3, 1e-2]
zip: [[batch_size, steps]]
exclude: [{batch_size: 4, lr: 1.0e-2}]
"""
    sw = specs.load(
        text=text.replace(
            "fixed: {task: mqar, arm: armed_gdn, d_model: 16, steps: 10, eval_every: 5}",
            "fixed: {task: mqar, arm: armed_gdn, d_model: 16, eval_every: 5}",
        )
    )
    pairs = {(p["batch_size"], p["steps"], p["lr"]) for _, p in sw.trials}
    assert pairs == {(4, 60, 0.001), (8, 40, 0.001), (8, 40, 0.01), (16, 30, 0.001), (16, 30, 0.01)}
    blocks = """
name: b
fixed: {task: mqar, d_model: 16, steps: 10, eval_every: 5}
axes: {seed: 0..1}
blocks:
  - axes: {arm: [armed_gdn, deltanet]}
  - fixed: {arm: gated_deltanet}
    axes: {seed: 0..3}
"""
    sw = specs.load(text=blocks)
    assert len(sw.trials) == 2 * 2 + 4
    assert sorted(p["seed"] for _, p in sw.trials if p["arm"] == "gated_deltanet") == [0, 1, 2, 3]


def test_quickstart_is_valid_and_large_enough():
    sw = specs.load(Path(__file__).parents[1] / "sweeps" / "quickstart.yaml")
    arms = {p["arm"] for _, p in sw.trials}
    lrs = {p["lr"] for _, p in sw.trials}
    seeds = {p["seed"] for _, p in sw.trials}
    assert len(arms) >= 2 and len(lrs) >= 2 and len(seeds) >= 2


# Every bad spec, as (text, what its one error line must say). Most are GOOD with one piece of
# text replaced or a tail appended: the tables below hold only the edit, made once in BAD.
_REPLACED = {
    "missing_name": ("name: t", "", "name: required key is missing"),
    "bad_name": ("name: t", "name: 'a b'", "name: String should match"),
    "unknown_param": ("  d_model: 16", "  d_modle: 16", "fixed.d_modle: unknown parameter 'd_modle'"),
    "bad_namespace": ("  d_model: 16", "  mdl.conv: 4", "fixed.mdl.conv: unknown parameter"),
    "unknown_arm": ("armed_gdn]", "armd_gdn]", "armd_gdn"),
    "unknown_task": ("task: mqar", "task: mqr", "mqr"),
    "unknown_knob": ("  d_model: 16", "  d_model: 16\n  model.convv: 4", "convv"),
    "unknown_task_param": ("task.K: 8", "task.KK: 8", "KK"),
    "wrong_type": ("lr: [1e-3, 3.0e-3]", "lr: [1e-3, fast]", "axes.lr[1]: Input should be a valid number"),
    "non_positive": ("steps: 20", "steps: 0", "budget.steps"),
    "negative_lr": ("lr: [1e-3, 3.0e-3]", "lr: [-1e-3]", "axes.lr[0]: Input should be greater than 0"),
    "empty_axis": ("lr: [1e-3, 3.0e-3]", "lr: []", "axes.lr: empty axis"),
    "scalar_axis": ("lr: [1e-3, 3.0e-3]", "lr: 0.001", "axes.lr: Input should be"),
    "duplicate_axis": ("  n_layers: 1", "  n_layers: 1\n  lr: 0.01", "axes.lr: duplicate axis"),
    "duplicate_value": ("seed: 0..2", "seed: [0, 1, 1]", "axes.seed[2]: value 1 appears twice"),
    "bad_range": ("seed: 0..2", "seed: 0..x", "axes.seed: a range must be"),
    "reversed_range": ("seed: 0..2", "seed: 5..2", "axes.seed: empty range"),
    "list_under_fixed": ("  n_layers: 1", "  n_layers: 1\n  batch_size: [1, 2]", "fixed.batch_size"),
    "no_arm": ("  arm: [gated_deltanet, armed_gdn]\n", "", "'arm' is required"),
    "warmup_too_long": (
        "eval_every: 10}",
        "eval_every: 10, warmup_steps: 20}",
        "warmup_steps (20) must be below steps (20)",
    ),
    "bad_schedule": ("eval_every: 10}", "eval_every: 10, schedule: linear}", "budget.schedule"),
}
_APPENDED = {
    "duplicate_yaml_key": ("\nname: again\n", "duplicate key 'name'"),
    "unknown_top_key": ("\naxis: {}\n", "axis: unknown key"),
    "zip_unequal": ("zip: [[arm, seed]]\n", "zip[0]: zipped axes must have equal lengths"),
    "zip_unknown": ("zip: [[arm, K]]\n", "zip[0]: 'K' is not an axis"),
    "exclude_unknown": ("exclude: [{K: 8}]\n", "exclude[0].K: 'K' is not a parameter"),
    "all_excluded": ("exclude: [{lr: [1.0e-3, 3.0e-3]}]\n", "no trials left"),
    "cpu_zero": ("resources: {cpu: 0}\n", "resources.cpu: Input should be greater than or equal to 0.01"),
    "gpu_fraction": ("resources: {gpu: 1.5}\n", "resources.gpu"),
    "negative_retries": ("retries: -1\n", "retries: Input should be greater than or equal"),
}
BAD = {
    "malformed_yaml": ("name: x\naxes: [1, 2\n", "malformed YAML at line"),
    "not_a_mapping": ("- 1\n- 2\n", "expected a mapping"),
    **{case: (GOOD.replace(old, new), expected) for case, (old, new, expected) in _REPLACED.items()},
    **{case: (GOOD + tail, expected) for case, (tail, expected) in _APPENDED.items()},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_spec_is_one_line_exit_2_and_no_db_write(case, tmp_path, capsys):
    text, expected = BAD[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    db = tmp_path / "never.db"
    code = main(["submit", str(path), "--db", str(db)])
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert code == 2, captured
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}: "), lines[0]
    assert expected in lines[0], lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert not db.exists()


@pytest.mark.slow
def test_missing_file_and_real_entry_point(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("lr: [1e-3, 3.0e-3]", "lr: []"))
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "submit", str(bad), "--db", str(tmp_path / "x.db")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {bad}: axes.lr: empty axis (give at least one value)"
    assert "Traceback" not in proc.stderr
    assert main(["submit", str(tmp_path / "nope.yaml")]) == 2


def test_dry_run_json(tmp_path, capsys):
    path = tmp_path / "g.yaml"
    path.write_text(GOOD)
    assert main(["submit", str(path), "--dry-run", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out == {
        "trials": 12,
        "axes": {"arm": ["gated_deltanet", "armed_gdn"], "lr": [0.001, 0.003], "seed": [0, 1, 2]},
    }
