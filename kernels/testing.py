"""Inputs and comparisons for checking one implementation of an operator against another.

Used by the tests and the benchmark; also handy for checking a new fast form (Triton,
an external library) against the naive reference: outputs, final state and the gradient
of every input, under one random cotangent so that every gradient path is exercised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

# Argument names in call order (initial_state is passed by keyword).
ARG_NAMES: dict[str, tuple[str, ...]] = {
    "delta_rule": ("q", "k", "v", "beta", "alpha"),
    "dplr_scan": ("r", "k", "v", "w", "kappa", "a"),
    "ssd_scan": ("x", "a", "b", "c"),
}


def make_inputs(
    op: str,
    batch: int,
    heads: int,
    seq_len: int,
    dk: int,
    dv: int | None = None,
    *,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
    seed: int = 0,
    gated: bool = True,
    with_state: bool = False,
    requires_grad: bool = True,
) -> dict[str, torch.Tensor | None]:
    """Realistic inputs in the ranges the cells produce, so the recurrences stay stable.

    delta_rule: unit-norm ``k``, ``beta`` in (0, 1), ``alpha`` in (0.5, 1) (``None`` unless
    ``gated``). dplr_scan: unit-norm ``kappa``, ``w`` in (0.5, 1), ``a`` in (0, 1), ``k``
    scaled by ``1/sqrt(dk)``. ssd_scan (``dk`` = N, ``dv`` = P): ``a`` in (0.5, 1), ``b``, ``c``
    scaled by ``1/sqrt(N)``. Drawn in fp64 from ``seed`` and cast, so every dtype sees the
    same numbers. ``with_state`` adds an ``initial_state`` of unit-scale entries.
    """
    dv = dk if dv is None else dv
    g = torch.Generator().manual_seed(seed)
    bht = (batch, heads, seq_len)

    def normal(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g, dtype=torch.float64)

    def uniform(lo: float, hi: float, *s: int) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(*s, generator=g, dtype=torch.float64)

    if op == "delta_rule":
        xs = {
            "q": normal(*bht, dk),
            "k": F.normalize(normal(*bht, dk), dim=-1),
            "v": normal(*bht, dv),
            "beta": uniform(0.0, 1.0, *bht),
            "alpha": uniform(0.5, 1.0, *bht) if gated else None,
        }
        state_shape = (batch, heads, dv, dk)
    elif op == "dplr_scan":
        xs = {
            "r": normal(*bht, dk),
            "k": normal(*bht, dk) / dk**0.5,
            "v": normal(*bht, dv),
            "w": uniform(0.5, 1.0, *bht, dk),
            "kappa": F.normalize(normal(*bht, dk), dim=-1),
            "a": uniform(0.0, 1.0, *bht, dk),
        }
        state_shape = (batch, heads, dv, dk)
    elif op == "ssd_scan":
        xs = {
            "x": normal(*bht, dv),
            "a": uniform(0.5, 1.0, *bht),
            "b": normal(*bht, dk) / dk**0.5,
            "c": normal(*bht, dk) / dk**0.5,
        }
        state_shape = (batch, heads, dv, dk)
    else:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(ARG_NAMES)}")
    if with_state:
        xs["initial_state"] = normal(*state_shape)
    return {
        name: None if x is None else x.to(device=device, dtype=dtype).requires_grad_(requires_grad)
        for name, x in xs.items()
    }


def run_with_grads(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    op: str,
    inputs: Mapping[str, torch.Tensor | None],
    seed: int = 1,
    **kwargs,
) -> dict[str, torch.Tensor]:
    """Call ``fn`` and backpropagate a fixed random cotangent through output and final state.

    Returns ``{"out", "state", "grad_<name>" for every input given (initial_state too)}``,
    all detached. The cotangent is drawn from ``seed`` so two implementations given the
    same inputs get the same one.
    """
    args = [inputs.get(name) for name in ARG_NAMES[op]]
    state0 = inputs.get("initial_state")
    out, state = fn(*args, initial_state=state0, **kwargs)
    g = torch.Generator().manual_seed(seed)
    w_out = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.device, out.dtype)
    w_state = torch.randn(state.shape, generator=g, dtype=torch.float64).to(state.device, state.dtype)
    loss = (out * w_out).sum() + (state * w_state).sum()
    wrt = {n: x for n, x in inputs.items() if x is not None and x.requires_grad}
    grads = torch.autograd.grad(loss, list(wrt.values()), allow_unused=True)
    result = {"out": out.detach(), "state": state.detach()}
    for n, gr in zip(wrt, grads):
        result[f"grad_{n}"] = torch.zeros_like(wrt[n]) if gr is None else gr
    return result


def max_abs_differences(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    """Largest absolute difference per key (both dicts must have the same keys), in fp64."""
    if a.keys() != b.keys():
        raise ValueError(f"different keys: {sorted(a)} vs {sorted(b)}")
    return {k: (a[k].double() - b[k].double()).abs().max().item() if a[k].numel() else 0.0 for k in a}


def assert_matches_reference(
    reference: Callable,
    fast: Callable,
    op: str,
    inputs: dict[str, torch.Tensor],
    expected: set[str],
    tol: float,
    **kwargs,
) -> dict[str, float]:
    """Run both forms with gradients; require exactly ``expected`` results (output, state,
    the named gradients), each within ``tol`` of the reference, and no reference gradient
    that vanished (which would make the comparison vacuous). Returns the differences."""
    ref = run_with_grads(reference, op, inputs)
    got = run_with_grads(fast, op, inputs, **kwargs)
    assert set(got) == expected, (sorted(got), sorted(expected))
    diffs = max_abs_differences(got, ref)
    assert max(diffs.values()) <= tol, diffs
    assert all(ref[k].abs().max() > 1e-3 for k in expected), "a reference gradient vanished"
    return diffs
