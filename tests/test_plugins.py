"""Bring your own cell and task: a plugin package written to a temp dir, put on PYTHONPATH
(the driver and the local Ray workers inherit it), registered through a spec's ``plugins:``
or an entry point (a dist-info folder on the path: what ``pip install`` would write); and
the guide's package, ``examples/plugin/``, installed by pip (``--target``, on PYTHONPATH),
found through its entry points alone. The plugins list in ``orchestrator cells`` / ``tasks``,
validate their knobs like built-ins, and one sweep runs both plugins' cells and tasks on
Ray workers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Every test here runs the CLI in a subprocess (the plugin must reach a fresh interpreter).
pytestmark = pytest.mark.slow

ORCH = [sys.executable, "-m", "orchestrator.cli"]
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugin"

CELLS = '''
"""A causal running-mean mixer: the tiniest recurrent cell (state: one vector)."""
import torch
import torch.nn as nn

from cells import ArmSpec, Family, Knob, KnobSet, register_cell


class CumMean(nn.Module):
    causal = True

    def __init__(self, d, scale):
        super().__init__()
        self.inp, self.out, self.scale, self.d = nn.Linear(d, d), nn.Linear(d, d), scale, d

    def forward(self, x):
        h = torch.cumsum(self.inp(x), dim=1)
        n = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[None, :, None]
        return self.out(self.scale * h / n)

    def state_elements(self):
        return self.d


def _check(arm, k, d):
    if k["scale"] > 4 and d < 16:
        raise ValueError(f"arm {arm!r} at d_model {d}: scale > 4 needs d_model >= 16")


FAMILY = Family("cummean", lambda k, d: (lambda: CumMean(d, k["scale"])), _check)
ARM = ArmSpec("cummean", "cummean", "causal running mean (plugin)", KnobSet({
    "scale": Knob(1.0, "float", "output scale", minimum=0.0, maximum=8.0),
    "mlp": Knob(True, "bool", "pre-norm residual MLP"),
    "mlp_ratio": Knob(2, "int", "MLP width multiple", minimum=1),
    "norm": Knob(True, "bool", "RMSNorm"),
}), d_model=16)
register_cell(ARM, FAMILY)
'''

TASKS = '''
from tasks import register_task
from tasks.mqar import MQAR


@register_task
class TinyRecall(MQAR):
    """MQAR under another name: a plugin task."""

    name = "tiny_recall"
'''

SPEC = """name: plug
plugins: [myplug.cells, myplug.tasks]
fixed:
  arm: cummean
  task: tiny_recall
  task.K: 4
  d_model: 16
  batch_size: 8
  model.scale: 2.0
axes:
  seed: [0, 1]
budget:
  steps: 20
  eval_every: 10
max_concurrent: 2
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("plugin")
    pkg = root / "myplug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cells.py").write_text(textwrap.dedent(CELLS))
    (pkg / "tasks.py").write_text(textwrap.dedent(TASKS))
    return root


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    """examples/plugin installed as a user would (pip builds it and writes its entry points),
    into a folder put on PYTHONPATH; built from a copy, so the repository stays clean."""
    root = tmp_path_factory.mktemp("example")
    src = shutil.copytree(EXAMPLE, root / "src")
    target = root / "site"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (target / "orch_example" / "tasks.py").is_file()
    return target


def _env(*paths: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), env.get("PYTHONPATH", "")])
    env.pop("ORCH_PLUGINS", None) if "ORCH_PLUGINS" not in extra else None
    return env


def _run(argv, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(ORCH + argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_entry_points_list_the_plugin(plugin, tmp_path):
    # An installed distribution's metadata, as pip would write it: entry points only.
    dist = tmp_path / "site" / "myplug-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[orchestrator.cells]\ncummean = myplug.cells\n\n[orchestrator.tasks]\ntiny_recall = myplug.tasks\n"
    )
    env = _env(plugin, tmp_path / "site")
    cells = _run(["cells", "--json", "--arms", "cummean,deltanet"], env, tmp_path)
    assert cells.returncode == 0, cells.stderr
    rows = {r["arm"]: r for r in json.loads(cells.stdout)}
    assert set(rows) == {"cummean", "deltanet"} and rows["cummean"]["state_elements"] == 32  # = d_model
    tasks = _run(["tasks", "--json"], env, tmp_path)
    assert tasks.returncode == 0, tasks.stderr
    assert "tiny_recall" in {r["task"] for r in json.loads(tasks.stdout)}
    # Without the plugin on the path, neither exists.
    bare = _run(["cells", "--arms", "cummean"], _env(), tmp_path)
    assert bare.returncode == 2 and "unknown arm 'cummean'" in bare.stderr


def test_the_installed_example_lists_and_its_task_decodes(example, tmp_path):
    env = _env(example)
    cells = _run(["cells", "--json", "--arms", "running_mean"], env, tmp_path)
    assert cells.returncode == 0, cells.stderr
    [row] = json.loads(cells.stdout)
    assert row["arm"] == "running_mean" and row["state_elements"] == row["d_model"]  # one vector
    tasks = _run(["tasks", "--json"], env, tmp_path)
    assert tasks.returncode == 0, tasks.stderr
    task = {r["task"]: r for r in json.loads(tasks.stdout)}["single_recall"]
    assert task["params"] == {"K": 4, "n_keys": 16, "n_values": 8, "eval_size": 1024}
    assert (task["vocab_size"], task["seq_len"], task["rebinding"]) == (16 + 8, 2 * 4 + 1, True)
    # Its reference decoder agrees with its generator, as tests/test_tasks.py checks built-ins.
    code = (
        "from orchestrator.plugins import load_entry_points; load_entry_points(); import tasks\n"
        "t = tasks.build('single_recall', **tasks.REGISTRY['single_recall'].small)\n"
        "for x, y in t.eval_batches(0):\n"
        "    for s, g in zip(x.tolist(), y.tolist()):\n"
        "        assert t.decode(s) == {p: v for p, v in enumerate(g) if v != -100}, s\n"
        "for x, y in t.rebinding_batches(0):  # rebound: every scored answer moved\n"
        "    for s, g in zip(x.tolist(), y.tolist()):\n"
        "        assert all(t.decode(s)[p] != v for p, v in enumerate(g) if v != -100), s\n"
        "print('ok', t.seq_len, t.vocab_size)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["ok", "7", "24"], r.stderr[-3000:]


def test_plugin_knobs_validate_like_built_ins(plugin, tmp_path):
    env = _env(plugin)
    for bad, msg in (("model.scale: 2.0", "model.scale: 9.0"), ("d_model: 16", "d_model: 8\n  model.scale: 5.0")):
        spec = tmp_path / "bad.yaml"
        spec.write_text(
            SPEC.replace("model.scale: 2.0", msg)
            if bad.startswith("model")
            else SPEC.replace("d_model: 16\n", "d_model: 8\n").replace("model.scale: 2.0", "model.scale: 5.0")
        )
        r = _run(["submit", str(spec), "--dry-run"], env, tmp_path)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert "scale" in r.stderr and ("8" in r.stderr or "d_model >= 16" in r.stderr), r.stderr
    spec = tmp_path / "noplug.yaml"
    spec.write_text(SPEC.replace("plugins: [myplug.cells, myplug.tasks]\n", ""))
    r = _run(["submit", str(spec), "--dry-run"], env, tmp_path)
    assert r.returncode == 2 and "unknown task 'tiny_recall'" in r.stderr
    spec.write_text(SPEC.replace("myplug.tasks", "myplug.nothere"))
    r = _run(["submit", str(spec), "--dry-run"], env, tmp_path)
    assert r.returncode == 2 and "cannot import plugin module 'myplug.nothere'" in r.stderr


def test_one_sweep_runs_both_plugins_on_ray_workers(plugin, example, tmp_path):
    # The temp-dir plugin through the spec's plugins:, the installed example through its
    # entry points only: each arm on each task.
    spec = tmp_path / "plug.yaml"
    spec.write_text(
        SPEC.replace("  arm: cummean\n  task: tiny_recall\n", "")
        .replace("  model.scale: 2.0\n", "")
        .replace("  seed: [0, 1]", "  arm: [cummean, running_mean]\n  task: [tiny_recall, single_recall]\n  seed: [0]")
    )
    db = tmp_path / "plug.db"
    env = _env(plugin, example)
    r = _run(["submit", str(spec), "--db", str(db), "--quiet"], env, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    q = (
        "SELECT f.arm, f.task, f.seed, f.status, f.final_step, round(f.final_acc, 4) AS "
        "final_acc, t.host, t.node_id IS NOT NULL AS on_ray FROM trial_final f "
        "JOIN trials t ON t.id = f.trial_id WHERE f.sweep = 'plug' ORDER BY f.arm, f.task"
    )
    out = _run(["sql", q, "--db", str(db), "--json"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    print(_run(["sql", q, "--db", str(db)], {**env, "COLUMNS": "120"}, tmp_path).stdout)
    assert [(x["arm"], x["task"], x["status"], x["final_step"]) for x in rows] == [
        ("cummean", "single_recall", "completed", 20),
        ("cummean", "tiny_recall", "completed", 20),
        ("running_mean", "single_recall", "completed", 20),
        ("running_mean", "tiny_recall", "completed", 20),
    ]
    assert all(0.0 <= x["final_acc"] <= 1.0 and x["on_ray"] == 1 for x in rows)
