"""What a trial needs of a machine: its parameter count from the model built to be counted,
its training memory on a host or a GPU (what ``resources: {gpu: auto}`` divides a GPU by, and
what the fleet places by), and the bounds a spec is refused at before anything trains."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from orchestrator.params import split
from orchestrator.spec.schema import Fail

# A trial's memory: weights, gradients and two Adam moments in fp32 = 16 bytes a parameter.
BYTES_PER_PARAM = 16
# Far past any study (the papers train at batch 4..256 and evaluate every 10..200 steps), and
# bounded so a typo cannot ask for a 2-billion batch or a billion eval rows per trial.
MAX_BATCH_SIZE = 65_536
MAX_EVALS_PER_TRIAL = 100_000


def node_memory_bytes() -> int:
    """Physical memory of this machine: the bound for one trial (``$ORCH_NODE_MEMORY_BYTES``
    overrides it, e.g. for the largest node of a cluster submitted to from a laptop)."""
    env = os.environ.get("ORCH_NODE_MEMORY_BYTES")
    if env and env.isdigit():
        return int(env)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB" if n < 1e12 else f"{n / 1e12:.3g} TB"


def _rough_params(params: Mapping[str, Any]) -> int | None:
    """A first bound on a trial's parameter count from its widths alone (None: no usable
    d_model), checked before anything is built, so a d_model of a million is refused in one
    line instead of constructed; :func:`model_params` is the count itself."""
    d = params.get("d_model") or 0
    n = params.get("n_layers") or 0
    if not isinstance(d, int) or not isinstance(n, int) or d <= 0:
        return None
    vocab = params.get("task.vocab_size") or 1000
    vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else 1000
    # ~16 d^2 weights per layer (mixer projections and the MLP) plus the embeddings.
    return max(n, 1) * 16 * d * d + 2 * vocab * d


def memory_check(params: Mapping[str, Any], where: str, fail, node_memory: int) -> None:
    """Refuse a model whose estimated training memory exceeds the largest node's memory,
    before anything is built (a bad d_model would otherwise allocate terabytes)."""
    n_params = _rough_params(params)
    if n_params is None:
        return
    need = n_params * BYTES_PER_PARAM
    if need > node_memory:
        fail(
            where,
            f"d_model={params.get('d_model')}, n_layers={params.get('n_layers')}: about {_gb(need)} per trial "
            f"({n_params:.3g} parameters x {BYTES_PER_PARAM} bytes), more than the "
            f"largest node's {_gb(node_memory)} of memory",
        )


# What one trial holds on a GPU besides its weights and optimizer state: the process's CUDA
# context and the caching allocator's first blocks (measured: 300-500 MB for torch 2 on
# Pascal to Hopper cards), and the activations the backward pass keeps: per layer about
# ACT_TENSORS tensors of (batch, sequence, d_model) in fp32, plus the logits and their
# gradient. tests/gpu/placement_check.py checks the estimate against a real card's peak.
CUDA_CONTEXT_BYTES = 512 * 2**20
ACT_TENSORS = 48


def _task_shape(params: Mapping[str, Any]) -> tuple[int, int]:
    """(sequence length, vocabulary) of a resolved trial's task, built once per setting."""
    top, _, task_params, _ = split(dict(params))
    return _task_shape_of(str(top.get("task")), tuple(sorted(task_params.items(), key=lambda kv: kv[0])))


_TASK_SHAPES: dict[tuple[str, tuple[tuple[str, Any], ...]], tuple[int, int]] = {}


def _task_shape_of(name: str, task_params: tuple[tuple[str, Any], ...]) -> tuple[int, int]:
    key = (name, task_params)
    if key not in _TASK_SHAPES:
        import tasks

        task = tasks.build(name, **dict(task_params))
        _TASK_SHAPES[key] = (int(task.seq_len), int(task.vocab_size))
    return _TASK_SHAPES[key]


_PARAM_COUNTS: dict[str, int] = {}


def model_signature(top: Mapping[str, Any], knobs: Mapping[str, Any], task_params: Mapping[str, Any]) -> str:
    return repr(
        (top["arm"], top["d_model"], top["n_layers"], sorted(knobs.items()), top["task"], sorted(task_params.items()))
    )


# A rough, generous parameter bound under which a model is built on the CPU to be counted
# (milliseconds for the factorials' models); above it, on the meta device.
CPU_BUILD_MAX_PARAMS = 16_000_000


def rough_size(top: Mapping[str, Any], knobs: Mapping[str, Any], vocab_size: int) -> int:
    """Far above any arm's parameter count at these sizes (embedding and head, and per layer
    64 matrices of the width by the larger of the width and the largest integer knob): only
    the choice of device to count on, never a count."""
    import cells

    # The arm's resolved knobs and dimensions (its defaults where the trial names none).
    _, resolved, d, layers = cells.registry.resolve(top["arm"], dict(knobs), top["d_model"], top["n_layers"])
    widest = max([d, *(int(v) for v in resolved.values() if isinstance(v, int) and not isinstance(v, bool))])
    return 2 * vocab_size * d + layers * 64 * d * widest


def build_count(top: Mapping[str, Any], knobs: Mapping[str, Any], task_params: Mapping[str, Any]) -> int:
    """Build the trial's task and model and count its parameters; constructor-level errors
    (heads that do not divide the width, a task that cannot be laid out) raise here.

    A small model is built on the CPU (its random initialisation under a forked RNG, so the
    caller's stream is untouched); a large one on torch's meta device (shapes without
    storage, so a 65M-parameter model costs nothing to check). Not meta for all: a meta
    tensor's arithmetic and random fills run through ``torch._refs``, whose first use imports
    torch's compiler stack (torch._dynamo, sympy): 1.2 s of CPU and 170 MB in every process
    that checks a spec, each driver included."""
    import torch

    import cells
    import tasks

    sig = model_signature(top, knobs, task_params)
    if sig not in _PARAM_COUNTS:
        task = tasks.build(top["task"], **task_params)
        small = rough_size(top, knobs, task.vocab_size) <= CPU_BUILD_MAX_PARAMS
        with torch.random.fork_rng(devices=[]), torch.no_grad(), torch.device("cpu" if small else "meta"):
            model = cells.build(
                top["arm"], vocab_size=task.vocab_size, d_model=top["d_model"], n_layers=top["n_layers"], **knobs
            )
        _PARAM_COUNTS[sig] = sum(p.numel() for p in model.parameters())
    return _PARAM_COUNTS[sig]


def model_params(params: Mapping[str, Any]) -> int:
    """The parameter count of a resolved trial's model, from the model itself (built once per
    distinct model, on the meta device)."""
    top, knobs, task_params, _ = split(dict(params))
    return build_count(top, knobs, task_params)


def _activation_bytes(params: Mapping[str, Any]) -> int:
    d = int(params.get("d_model") or 0)
    layers = max(int(params.get("n_layers") or 1), 1)
    batch = int(params.get("batch_size") or 1)
    seq, vocab = _task_shape(params)
    return 4 * batch * seq * (ACT_TENSORS * layers * d + 3 * vocab)


def train_memory_bytes(params: Mapping[str, Any]) -> int:
    """Estimated memory of training one resolved trial, on the host or a GPU alike: weights,
    gradients and two Adam moments of the built model, and the activations of one batch."""
    return model_params(params) * BYTES_PER_PARAM + _activation_bytes(params)


def gpu_memory_bytes(params: Mapping[str, Any], members: int = 1) -> int:
    """Estimated GPU memory of one training process of this resolved trial (``members``: a
    seed pack of that many trials trained as one model): the CUDA context, weights,
    gradients and Adam state of the built model, and the activations of one batch. What
    ``resources: {gpu: auto}`` divides a GPU by."""
    return CUDA_CONTEXT_BYTES + members * train_memory_bytes(params)


def size_check(resolved: Mapping[str, Any], where: str, fail: Fail, node_memory: int) -> None:
    """The built model's training memory against the largest node, a batch no study comes
    near, and the eval rows one trial would store."""
    batch = int(resolved["batch_size"])
    if batch > MAX_BATCH_SIZE:
        fail(where, f"batch_size {batch:,} is above {MAX_BATCH_SIZE:,} (far past any study's batch)")
    rows = int(resolved["steps"]) // int(resolved["eval_every"]) + 2
    if rows > MAX_EVALS_PER_TRIAL:
        fail(
            where,
            f"steps {resolved['steps']:,} / eval_every {resolved['eval_every']:,} stores about {rows:,} eval rows "
            f"per trial, above {MAX_EVALS_PER_TRIAL:,}: evaluate less often",
        )
    n_params = model_params(resolved)
    need = train_memory_bytes(resolved)
    if need > node_memory:
        fail(
            where,
            f"{resolved['arm']} with these settings has {n_params:,} parameters: about {_gb(need)} to train "
            f"(weights, gradients and Adam state x {BYTES_PER_PARAM} bytes, plus one batch's activations), "
            f"more than the largest node's {_gb(node_memory)} of memory",
        )
