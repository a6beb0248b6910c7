"""The chunk state pass's one-node form (hand-written backward) against its traced form.

``kernels.chunking.chunk_state_pass`` runs as one autograd node outside torch.func
transforms and as plain differentiable ops inside them; both must give the same outputs
and the same gradients for every argument, for each decay layout the kernels use (none,
a scalar per chunk as in the delta rule, a per-key-channel vector as in the DPLR scan),
with and without injected terms, for both signs. fp64, odd sizes.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.chunking import _state_pass_traced, chunk_state_pass

B, H, N, C, DV, DK = 2, 3, 4, 5, 3, 7


def _inputs(decay: str | None, inject: bool, seed: int) -> list[torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).requires_grad_()

    decay_end = None
    if decay == "scalar":
        decay_end = torch.rand(B, H, N, 1, 1, generator=gen, dtype=torch.float64).requires_grad_()
    elif decay == "vector":
        decay_end = torch.rand(B, H, N, 1, DK, generator=gen, dtype=torch.float64).requires_grad_()
    return [
        rnd(B, H, DV, DK),
        rnd(B, H, N, C, DV),
        rnd(B, H, N, C, DK, scale=0.3),
        rnd(B, H, N, C, DK, scale=0.3),
        decay_end,
        rnd(B, H, N, DV, DK) if inject else None,
    ]


@pytest.mark.parametrize("decay", [None, "scalar", "vector"])
@pytest.mark.parametrize("inject", [False, True])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_node_pass_matches_traced_pass(decay, inject, sign):
    seed = [None, "scalar", "vector"].index(decay) * 4 + 2 * inject + (sign > 0)
    args = _inputs(decay, inject, seed=seed)
    got = chunk_state_pass(*args, sign=sign)
    want = _state_pass_traced(*args, sign)
    assert got[0].grad_fn is not None and "StatePass" in type(got[0].grad_fn).__name__
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    gen = torch.Generator().manual_seed(7)
    grads_out = [torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in want]
    live = [x for x in args if x is not None]
    g_got = torch.autograd.grad(got, live, grads_out)
    g_want = torch.autograd.grad(want, live, grads_out)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_one_node_pass_with_only_some_outputs_used():
    """Unused outputs reach the backward as None (final state only; rows only)."""
    args = _inputs("vector", True, seed=3)
    live = [x for x in args if x is not None]
    for pick in (2, 1, 0):
        got = torch.autograd.grad(chunk_state_pass(*args)[pick].sum(), live)
        want = torch.autograd.grad(_state_pass_traced(*args, 1.0)[pick].sum(), live)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_gradcheck_one_node_pass():
    args = _inputs("scalar", True, seed=5)
    torch.autograd.gradcheck(lambda *a: chunk_state_pass(*a, sign=-1.0), tuple(args))


@pytest.mark.parametrize("op", ["delta_rule", "dplr_scan"])
def test_kernel_under_vmap_matches_plain_calls(op):
    """Under vmap the traced pass runs; per-member plain calls run the one-node pass."""
    gen = torch.Generator().manual_seed(11)
    members, b, h, t, d = 3, 2, 1, 21, 6

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(members, *shape, generator=gen, dtype=torch.float64)

    if op == "delta_rule":
        q, k = (torch.nn.functional.normalize(r(b, h, t, d), dim=-1) for _ in range(2))
        xs = (q, k, r(b, h, t, d), torch.sigmoid(r(b, h, t)), torch.sigmoid(r(b, h, t) + 2))
    else:
        xs = (
            r(b, h, t, d),
            r(b, h, t, d) * 0.3,
            r(b, h, t, d),
            torch.exp(-0.6 * torch.sigmoid(r(b, h, t, d))),
            torch.nn.functional.normalize(r(b, h, t, d), dim=-1),
            torch.sigmoid(r(b, h, t, d)),
        )
    fn = getattr(kernels, op)

    def loss(*a):
        return fn(*a, impl="chunk", chunk_size=4)[0].square().sum()

    argnums = tuple(range(len(xs)))
    got = torch.func.vmap(torch.func.grad(loss, argnums=argnums))(*xs)
    for i in range(members):
        member = [x[i].clone().requires_grad_() for x in xs]
        want = torch.autograd.grad(loss(*member), member)
        for a, w in zip(got, want):
            torch.testing.assert_close(a[i], w, rtol=1e-10, atol=1e-10)
