"""How ``resources: {gpu: auto | fraction, accelerator: ...}`` sizes and assigns units of work
to node types (runner/fleet.py's ``assign``, on node types given here; the simulated fleet
with real raylets is tests/test_fleet.py), the GPU memory estimate it divides by, and the
device layer's fake-card test switch."""

from __future__ import annotations

import torch
import pytest

from orchestrator.errors import UserError
from orchestrator.runner.fleet import USABLE, GpuNode, NodeType, assign, fraction, per_gpu, resources_of
from orchestrator.spec import CUDA_CONTEXT_BYTES, Resources, gpu_memory_bytes, load
from orchestrator.train import device

GIB = 2**30
SPEC = """name: f
fixed: {task: mqar, task.K: 8, arm: armed_gdn, n_layers: 2, batch_size: 64}
axes: {seed: 0..11, d_model: [32]}
budget: {steps: 20, eval_every: 10}
"""


def _params(d: int = 32, batch: int = 64) -> dict:
    text = SPEC.replace("[32]", f"[{d}]").replace("batch_size: 64", f"batch_size: {batch}")
    return load(text=text).trials[0][1]


def _units(n: int, params: dict, cpu: float = 1.0, gpu: float = 0.0) -> list[dict]:
    return [{"members": [{"trial_id": i, "params": params}], "cpu": cpu, "gpu": gpu} for i in range(n)]


def _type(acc: str | None, gib: float, gpus: float = 1, cpus: float = 64, nodes: int = 1) -> NodeType:
    ns = tuple(GpuNode(f"{acc}-{i}", acc, gpus, cpus) for i in range(nodes))
    return NodeType(acc, int(gib * GIB), f"card {acc}", ns)


@pytest.mark.parametrize("k", range(1, 65))
def test_a_fraction_lets_exactly_k_share_a_gpu_at_rays_granularity(k):
    f = fraction(k)
    assert f == round(f, 4)  # Ray keeps 1e-4
    assert k * f <= 1.0 < (k + 1) * f


def test_the_estimate_grows_with_the_model_and_the_batch_and_packs_share_one_context():
    small, wide, big_batch = _params(32), _params(128), _params(32, batch=256)
    assert CUDA_CONTEXT_BYTES < gpu_memory_bytes(small) < gpu_memory_bytes(wide)
    assert gpu_memory_bytes(small) < gpu_memory_bytes(big_batch)
    own = gpu_memory_bytes(small) - CUDA_CONTEXT_BYTES
    assert gpu_memory_bytes(small, members=4) == CUDA_CONTEXT_BYTES + 4 * own


def test_auto_sizes_per_node_type_and_shares_units_by_capacity():
    p = _params()
    est = gpu_memory_bytes(p)
    small, big = _type("G1070", 8, gpus=2), _type("A100", 80, gpus=1)
    k_small, k_big = int(USABLE * 8 * GIB // est), min(64, int(USABLE * 80 * GIB // est))
    assert per_gpu(est, small.gpu_memory) == k_small and per_gpu(est, big.gpu_memory) == k_big
    cap_small, cap_big = 2 * k_small, k_big  # both under the nodes' 64 CPUs
    n = 10 * (cap_small + cap_big)
    units = assign(_units(n, p), [big, small], Resources(gpu="auto"))
    on = {acc: [u for u in units if u["accelerator"] == acc] for acc in ("A100", "G1070")}
    assert len(on["A100"]) / n == pytest.approx(cap_big / (cap_small + cap_big), abs=1 / n)
    assert {u["gpu"] for u in on["A100"]} == {fraction(k_big)}
    assert {u["gpu"] for u in on["G1070"]} == {fraction(k_small)}
    assert all(u["pin"] for u in units)
    assert resources_of(on["G1070"][0]) == {"accelerator_type:G1070": 0.001}


def test_cpus_bound_the_share_too():
    p = _params()
    # The A100 holds dozens by memory but its node has 4 CPUs: four at once, like the 1070's four.
    big, small = _type("A100", 80, cpus=4), _type("G1070", 8, cpus=64)
    k_small = per_gpu(gpu_memory_bytes(p), small.gpu_memory)
    units = assign(_units(8 * (4 + k_small), p), [big, small], Resources(gpu="auto"))
    share = sum(u["accelerator"] == "A100" for u in units) / len(units)
    assert share == pytest.approx(4 / (4 + k_small), abs=0.02)


def test_an_accelerator_list_keeps_units_to_those_types():
    p = _params()
    types = [_type("A100", 80), _type("G1070", 8), _type("H100", 80)]
    units = assign(_units(12, p), types, Resources(gpu="auto", accelerator=["G1070"]))
    assert {u["accelerator"] for u in units} == {"G1070"} and all(u["pin"] for u in units)
    fixed = assign(_units(12, p, gpu=0.5), types, Resources(gpu=0.5, accelerator=["A100", "H100"]))
    assert {u["accelerator"] for u in fixed} == {"A100", "H100"}
    assert {u["gpu"] for u in fixed} == {0.5} and all(u["pin"] for u in fixed)


def test_a_fixed_fraction_without_accelerator_is_not_pinned():
    p = _params()
    one = assign(_units(3, p, gpu=0.25), [_type("A100", 80)], Resources(gpu=0.25))
    assert {(u["gpu"], u["accelerator"], u["pin"]) for u in one} == {(0.25, "A100", False)}
    two = assign(_units(3, p, gpu=0.25), [_type("A100", 80), _type("G1070", 8)], Resources(gpu=0.25))
    assert {(u["gpu"], u["accelerator"], u["pin"]) for u in two} == {(0.25, None, False)}
    assert resources_of(two[0]) == {}


def test_nodes_ray_cannot_tell_apart_get_the_smallest_gpus_fraction_anywhere():
    p = _params()
    units = assign(_units(4, p), [_type("A100", 80), _type(None, 8)], Resources(gpu="auto"))
    k = per_gpu(gpu_memory_bytes(p), 8 * GIB)
    assert {(u["gpu"], u["accelerator"], u["pin"]) for u in units} == {(fraction(k), None, False)}


def test_a_trial_larger_than_every_gpu_is_refused():
    p = _params(d=2048, batch=256)
    assert gpu_memory_bytes(p) > USABLE * 8 * GIB
    with pytest.raises(UserError, match="fits no GPU node"):
        assign(_units(1, p), [_type("G1070", 8)], Resources(gpu="auto"))


def test_the_fake_gpu_switch(monkeypatch):
    monkeypatch.setenv("ORCH_FAKE_GPU", "GTX 1070:8GiB")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    card = device.gpu_card()
    assert card == device.GpuCard("GTX 1070", 8 * GIB, fake=True)
    assert device.device_label(torch.device("cpu"), False) == "fake-gpu:1 GTX 1070 (cpu, fp32)"
    monkeypatch.setenv("ORCH_FAKE_GPU", "A100:80 GB")
    assert device.gpu_card() == device.GpuCard("A100", 80 * 10**9, fake=True)
    monkeypatch.setenv("ORCH_FAKE_GPU", "a card")
    with pytest.raises(ValueError, match="expected NAME:SIZE"):
        device.gpu_card()
    monkeypatch.delenv("ORCH_FAKE_GPU")
    assert device.device_label(torch.device("cpu"), False) == "cpu (fp32)"
