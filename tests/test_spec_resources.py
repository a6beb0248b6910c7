"""Counting a trial's parameters when a spec is checked: small models are built on the CPU,
large ones on the meta device, and both give the model's true count. The CPU path is there
because meta tensors' arithmetic and random fills import torch's compiler stack
(torch._dynamo, sympy): 1.2 s of CPU and 170 MB in every process that checks a spec."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cells
import tasks
from cells.registry import ARMS
from orchestrator.spec import resources


def _meta_count(arm: str, d: int, layers: int, task) -> int:
    with torch.device("meta"):
        model = cells.build(arm, vocab_size=task.vocab_size, d_model=d, n_layers=layers)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_counts_the_same_on_the_cpu_as_on_the_meta_device(arm, monkeypatch):
    monkeypatch.setattr(resources, "_PARAM_COUNTS", {})
    task = tasks.build("mqar", K=8)
    for d, layers in ((16, 1), (32, 2), (64, 1)):
        top = {"arm": arm, "task": "mqar", "d_model": d, "n_layers": layers}
        assert resources.rough_size(top, {}, task.vocab_size) <= resources.CPU_BUILD_MAX_PARAMS  # the CPU path
        assert resources.build_count(top, {}, {"K": 8}) == _meta_count(arm, d, layers, task)


def test_a_large_model_is_counted_on_the_meta_device(monkeypatch):
    # 65M parameters: above the bound, so built without storage (the count is the real one:
    # tests/test_hostile_specs.py builds it for real).
    monkeypatch.setattr(resources, "_PARAM_COUNTS", {})
    built: list[str] = []
    real_build = cells.build

    def build(*args, **kwargs):
        built.append(torch.empty(0).device.type)  # the device factory calls land on
        return real_build(*args, **kwargs)

    monkeypatch.setattr(cells, "build", build)
    top = {"arm": "gated_deltanet", "task": "mqar", "d_model": 32, "n_layers": 1}
    knobs = {"mlp_hidden": 1_000_000}
    assert resources.rough_size(top, knobs, tasks.build("mqar", K=8).vocab_size) > resources.CPU_BUILD_MAX_PARAMS
    assert resources.build_count(top, knobs, {"K": 8}) == 65_010_205
    assert built == ["meta"]


def test_counting_leaves_the_callers_random_stream_alone(monkeypatch):
    monkeypatch.setattr(resources, "_PARAM_COUNTS", {})
    torch.manual_seed(5)
    want = torch.rand(4)
    torch.manual_seed(5)
    resources.build_count({"arm": "armed_gdn", "task": "mqar", "d_model": 16, "n_layers": 1}, {}, {"K": 8})
    assert torch.equal(torch.rand(4), want)


def test_checking_the_quickstart_never_imports_the_compiler_stack():
    quickstart = Path(__file__).resolve().parents[1] / "sweeps" / "quickstart.yaml"
    code = (
        f"import sys; from orchestrator.spec import load; s = load({str(quickstart)!r}); "
        "print(len(s.trials), 'torch._dynamo' in sys.modules, 'sympy' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["8", "False", "False"], res.stdout
