"""GPU trials on a mixed fleet: which node type a unit of work goes to and what fraction of a
GPU it asks for there.

``resources: {gpu: auto}``: a unit's GPU fraction on a node type is its estimated GPU memory
(``spec.gpu_memory_bytes``) over the memory of that type's GPU, so four small trials share a
GTX 1070 (8 GB) and dozens an A100 (80 GB). Ray places by fixed requests, not by
alternatives, so each unit is given one node type: the types share the units in proportion
to how many of them each runs at once (a wave of units is spread evenly), and the unit asks
for that type's Ray accelerator resource (``accelerator_type:A100``, which Ray sets on GPU
nodes and ``ray start --resources`` can declare) beside its fraction. ``resources:
{accelerator: A100}`` (or a list) keeps the units to those types, with a fixed fraction or
``auto``.

Each type's GPU memory is read on one of its nodes by a tiny Ray task through the device
layer (``train.device.gpu_card``; ``$ORCH_FAKE_GPU`` fakes it in tests).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UserError
from orchestrator.spec import Resources, gpu_memory_bytes

ACCELERATOR_PREFIX = "accelerator_type:"
PIN = 0.001  # of a node's accelerator resource per unit: Ray's own amount for `accelerator_type=`
USABLE = 0.9  # of a GPU's memory that trials may fill (the rest: fragmentation, the driver's own)
MAX_PER_GPU = 64  # trials sharing one GPU at most (beyond, CPUs and kernels bind first)
GRANULE = 10_000  # Ray keeps resource amounts to 1e-4
PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class GpuNode:
    """One alive Ray node with GPUs."""

    node_id: str
    accelerator: str | None  # its ``accelerator_type:X`` resource, None when it has none
    gpus: float
    cpus: float


@dataclass(frozen=True)
class NodeType:
    """The GPU nodes of one accelerator type: their GPU's memory (the smallest among them),
    how many GPUs and CPUs they have in all, and their card's name."""

    accelerator: str | None
    gpu_memory: int
    card: str
    nodes: tuple[GpuNode, ...]


def gpu_nodes() -> list[GpuNode]:
    import ray

    out = []
    for n in ray.nodes():
        res = n.get("Resources", {})
        if not n.get("Alive") or res.get("GPU", 0) <= 0:
            continue
        types = sorted(k[len(ACCELERATOR_PREFIX) :] for k in res if k.startswith(ACCELERATOR_PREFIX))
        out.append(GpuNode(n["NodeID"], types[0] if types else None, float(res["GPU"]), float(res.get("CPU", 0.0))))
    return out


def _read_card() -> tuple[str, int] | None:
    from orchestrator.train.device import gpu_card

    card = gpu_card()
    return (card.name, card.memory) if card is not None else None


def node_types(nodes: Sequence[GpuNode], timeout_s: float = PROBE_TIMEOUT_S) -> list[NodeType]:
    """The fleet's GPU node types, each node's card read by a Ray task pinned to it (no GPU
    asked: the task sees the node's GPUs through Ray's NOSET switch)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, num_gpus=0)(_read_card)
    env = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    refs = [
        probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False), runtime_env=env
        ).remote()
        for n in nodes
    ]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        raise UserError(f"resources.gpu: auto: no answer within {timeout_s:g} s from a GPU node asked for its card")
    cards = ray.get(refs)
    grouped: dict[str | None, list[tuple[GpuNode, tuple[str, int]]]] = {}
    for node, card in zip(nodes, cards):
        if card is None:
            raise UserError(
                f"resources.gpu: auto: Ray node {node.node_id[:12]} declares {node.gpus:g} GPU(s) but its "
                "workers see none (CUDA missing there?)"
            )
        grouped.setdefault(node.accelerator, []).append((node, card))
    return [
        NodeType(acc, min(c[1] for _, c in members), members[0][1][0], tuple(n for n, _ in members))
        for acc, members in sorted(grouped.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))
    ]


def per_gpu(estimate: int, gpu_memory: int) -> int:
    """How many processes of ``estimate`` bytes one GPU of ``gpu_memory`` bytes holds."""
    return min(MAX_PER_GPU, int(USABLE * gpu_memory // max(estimate, 1)))


def fraction(k: int) -> float:
    """The GPU fraction that lets exactly ``k`` share a GPU (rounded down to Ray's 1e-4)."""
    return math.floor(GRANULE / k) / GRANULE


def _capacity(t: NodeType, frac: float, cpu: float) -> int:
    """Units of ``frac`` GPU and ``cpu`` CPUs the type's nodes run at once."""
    total = 0
    for n in t.nodes:
        by_gpu = int(n.gpus // frac)
        by_cpu = int(n.cpus // cpu) if cpu else by_gpu
        total += min(by_gpu, by_cpu)
    return total


def check(resources: Resources, params: Sequence[Mapping[str, Any]] = ()) -> None:
    """Refuse, before anything is written, what no node of the cluster can run: an
    accelerator type it lacks, or (``gpu: auto``) a trial larger than every GPU."""
    if resources.gpu == 0 and not resources.accelerator:
        return
    nodes = gpu_nodes()
    if not nodes:
        raise UserError(f"resources.gpu: {resources.gpu}: the Ray cluster has no GPU")
    if resources.accelerator:
        found = {n.accelerator for n in nodes}
        missing = [a for a in resources.accelerator if a not in found]
        if len(missing) == len(resources.accelerator):
            known = ", ".join(sorted(a for a in found if a)) or "none declared"
            raise UserError(
                f"resources.accelerator: no GPU node of the cluster is {' or '.join(missing)} (its types: {known})"
            )
    if resources.gpu == "auto" and params:
        types = _allowed(node_types(nodes), resources)
        biggest = max(types, key=lambda t: t.gpu_memory)
        need = max(gpu_memory_bytes(p) for p in params)
        if per_gpu(need, biggest.gpu_memory) == 0:
            raise UserError(
                f"resources.gpu: auto: a trial needs about {need / 2**30:.3g} GiB of GPU memory (estimated), more "
                f"than {USABLE:.0%} of the largest GPU's {biggest.gpu_memory / 2**30:.3g} GiB ({biggest.card})"
            )


def _allowed(types: list[NodeType], resources: Resources) -> list[NodeType]:
    if resources.accelerator:
        types = [t for t in types if t.accelerator in resources.accelerator]
    return types


def place(units: list[dict[str, Any]], resources: Resources) -> list[dict[str, Any]]:
    """Give each GPU unit its node type and its GPU fraction there: sets ``gpu``,
    ``accelerator`` (the type; None when Ray cannot tell) and ``pin`` (whether the unit asks
    for the type's Ray resource). A fixed fraction with no accelerator asked is not pinned:
    Ray puts it on any GPU, and the type is recorded when the cluster has only one."""
    nodes = gpu_nodes()
    return assign(units, node_types(nodes) if resources.gpu == "auto" else _types_unprobed(nodes), resources)


def assign(units: list[dict[str, Any]], types: list[NodeType], resources: Resources) -> list[dict[str, Any]]:
    """:func:`place` on the fleet's node ``types``."""
    auto = resources.gpu == "auto"
    types = _allowed(types, resources)
    if not types:
        raise UserError("resources.accelerator: no GPU node of the cluster has the type asked for")
    if not auto and not resources.accelerator:
        only = types[0].accelerator if len(types) == 1 else None
        for unit in units:
            unit.update(accelerator=only, pin=False)
        return units
    if len(types) > 1 and not all(t.accelerator is not None for t in types):
        # Nodes Ray cannot tell apart: one fraction that fits the smallest GPU, anywhere.
        types = [NodeType(None, min(t.gpu_memory for t in types), "", tuple(n for t in types for n in t.nodes))]
    pin = types[0].accelerator is not None
    load = [0.0] * len(types)
    for unit in units:
        cpu = float(unit["cpu"])
        if auto:
            estimate = gpu_memory_bytes(unit["members"][0]["params"], members=len(unit["members"]))
            fracs = [fraction(k) if (k := per_gpu(estimate, t.gpu_memory)) else 0.0 for t in types]
        else:
            fracs = [float(unit["gpu"])] * len(types)
        caps = [_capacity(t, f, cpu) if f > 0 else 0 for t, f in zip(types, fracs)]
        options = [(load[i] + 1.0 / caps[i], i) for i in range(len(types)) if caps[i] > 0]
        if not options:
            raise UserError(
                f"resources: trial {unit['members'][0]['trial_id']} fits no GPU node of the allowed types "
                f"({', '.join(str(t.accelerator) for t in types)})"
            )
        _, best = min(options)
        load[best] += 1.0 / caps[best]
        unit.update(gpu=fracs[best], accelerator=types[best].accelerator, pin=pin)
    return units


def _types_unprobed(nodes: Sequence[GpuNode]) -> list[NodeType]:
    """Node types by accelerator only (a fixed fraction needs no card's memory)."""
    grouped: dict[str | None, list[GpuNode]] = {}
    for n in nodes:
        grouped.setdefault(n.accelerator, []).append(n)
    return [NodeType(acc, 0, "", tuple(ns)) for acc, ns in grouped.items()]


def resources_of(unit: Mapping[str, Any]) -> dict[str, float]:
    """A unit's Ray request beyond CPUs and GPUs: its node type's accelerator resource."""
    acc = unit.get("accelerator")
    return {f"{ACCELERATOR_PREFIX}{acc}": PIN} if unit.get("pin") and acc else {}
