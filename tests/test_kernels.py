"""The delta-rule operator (naive reference and chunk form) and the ``impl`` dispatcher.

The naive reference is checked against the equation written with explicit matrices; alpha =
None against alpha = 1, autocast, determinism, an empty sequence, bad shapes, vmap. The chunk
form against the reference (the checks every operator shares) is ``test_kernels_chunk_form.py``.
"""

from __future__ import annotations

import sys

import pytest
import torch

import kernels
from kernels import dispatch
from kernels.delta_rule import delta_rule_naive
from kernels.testing import make_inputs, max_abs_differences, run_with_grads

B, H, T, DK, DV = 2, 3, 37, 6, 5


def _literal_delta_rule(q, k, v, beta, alpha, initial_state):
    """Eq. (2) term by term, with the Dk x Dk matrix I - beta k k^T built explicitly."""
    b, h, t_len, dk = q.shape
    state = initial_state.clone()
    outs = torch.empty(b, h, t_len, v.shape[-1], dtype=q.dtype)
    eye = torch.eye(dk, dtype=q.dtype)
    for i in range(b):
        for j in range(h):
            s = state[i, j]
            for t in range(t_len):
                kt = k[i, j, t][:, None]
                a = 1.0 if alpha is None else alpha[i, j, t]
                s = a * s @ (eye - beta[i, j, t] * kt @ kt.T) + beta[i, j, t] * v[i, j, t][:, None] @ kt.T
                outs[i, j, t] = s @ q[i, j, t]
            state[i, j] = s
    return outs, state


@pytest.mark.parametrize("gated", [False, True])
def test_naive_matches_the_equation_with_explicit_matrices(gated):
    x = make_inputs("delta_rule", 2, 2, 9, 4, 3, gated=gated, with_state=True, requires_grad=False)
    want_o, want_s = _literal_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["alpha"], x["initial_state"])
    got_o, got_s = delta_rule_naive(x["q"], x["k"], x["v"], x["beta"], x["alpha"], initial_state=x["initial_state"])
    torch.testing.assert_close(got_o, want_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_s, want_s, rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", ["naive", "chunk"])
def test_alpha_none_equals_alpha_ones(impl):
    x = make_inputs("delta_rule", B, H, T, DK, DV, gated=False, with_state=True, seed=4)
    plain = run_with_grads(kernels.delta_rule, "delta_rule", x, impl=impl, chunk_size=8)
    ones = dict(x, alpha=torch.ones(B, H, T, dtype=torch.float64, requires_grad=True))
    gated = run_with_grads(kernels.delta_rule, "delta_rule", ones, impl=impl, chunk_size=8)
    gated.pop("grad_alpha")
    diffs = max_abs_differences(plain, gated)
    assert max(diffs.values()) <= 1e-12, diffs


def test_autocast_does_not_lower_the_recurrence_precision():
    x = make_inputs("delta_rule", B, H, T, DK, DV, with_state=True, seed=8, dtype=torch.float32, requires_grad=False)
    args = [x[n] for n in ("q", "k", "v", "beta", "alpha")]
    plain = kernels.delta_rule(*args, impl="chunk", initial_state=x["initial_state"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = kernels.delta_rule(*args, impl="chunk", initial_state=x["initial_state"])
    assert cast[0].dtype == torch.float32
    torch.testing.assert_close(cast[0], plain[0], rtol=0, atol=0)
    torch.testing.assert_close(cast[1], plain[1], rtol=0, atol=0)


def test_same_inputs_give_bitwise_identical_results():
    x = make_inputs("delta_rule", B, H, T, DK, DV, with_state=True, seed=9, dtype=torch.float32)
    a = run_with_grads(kernels.delta_rule, "delta_rule", x, impl="chunk")
    b = run_with_grads(kernels.delta_rule, "delta_rule", x, impl="chunk")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_zero_length_sequence_returns_the_initial_state():
    x = make_inputs("delta_rule", B, H, 0, DK, DV, with_state=True, requires_grad=False)
    o, s = kernels.delta_rule(x["q"], x["k"], x["v"], x["beta"], x["alpha"], initial_state=x["initial_state"])
    assert o.shape == (B, H, 0, DV)
    torch.testing.assert_close(s, x["initial_state"], rtol=0, atol=0)


# --- dispatcher --------------------------------------------------------------------------


def test_impls_lists_every_operator_with_auto():
    impls = kernels.IMPLS
    assert set(impls) == {"delta_rule", "dplr_scan", "ssd_scan"}
    for op, names in impls.items():
        assert names[:2] == ("naive", "chunk") and names[-1] == "auto", (op, names)
    assert "triton" not in impls["ssd_scan"]
    triton_loads = dispatch.triton_module()[0] is not None
    assert ("triton" in impls["delta_rule"]) == triton_loads
    assert ("triton" in impls["dplr_scan"]) == triton_loads


def test_auto_on_cpu_is_the_chunk_form():
    assert kernels.resolve_impl("delta_rule", "auto", torch.device("cpu")) == "chunk"
    assert kernels.resolve_impl("ssd_scan", "auto", torch.device("cuda")) == "chunk"
    x = make_inputs("delta_rule", B, H, T, DK, DV, seed=10, requires_grad=False)
    args = [x[n] for n in ("q", "k", "v", "beta", "alpha")]
    auto = kernels.delta_rule(*args)
    chunk = kernels.delta_rule(*args, impl="chunk")
    assert torch.equal(auto[0], chunk[0]) and torch.equal(auto[1], chunk[1])


def test_unknown_impl_names_the_allowed_values():
    x = make_inputs("delta_rule", 1, 1, 4, 3, requires_grad=False)
    with pytest.raises(ValueError, match="naive, chunk, triton, auto"):
        kernels.delta_rule(x["q"], x["k"], x["v"], x["beta"], impl="fast")
    with pytest.raises(ValueError, match="naive, chunk, auto"):
        kernels.ssd_scan(
            torch.zeros(1, 1, 4, 2),
            torch.ones(1, 1, 4),
            torch.zeros(1, 1, 4, 3),
            torch.zeros(1, 1, 4, 3),
            impl="triton",
        )


def test_missing_triton_module_gives_a_clear_error_and_auto_falls_back(monkeypatch):
    # A None entry in sys.modules makes ``import kernels.triton_scan`` raise ImportError.
    monkeypatch.setitem(sys.modules, "kernels.triton_scan", None)
    dispatch.triton_module.cache_clear()
    try:
        assert kernels.IMPLS["delta_rule"] == ("naive", "chunk", "auto")
        assert kernels.IMPLS["dplr_scan"] == ("naive", "chunk", "auto")
        x = make_inputs("delta_rule", 1, 1, 4, 3, requires_grad=False)
        with pytest.raises(ValueError, match='impl="triton" is unavailable for delta_rule.*does not import'):
            kernels.delta_rule(x["q"], x["k"], x["v"], x["beta"], impl="triton")
        assert kernels.resolve_impl("dplr_scan", "auto", torch.device("cuda")) == "chunk"
    finally:
        monkeypatch.undo()
        dispatch.triton_module.cache_clear()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda x: x.update(k=x["k"][..., :-1]), "k must be"),
        (lambda x: x.update(beta=x["beta"][..., None]), "beta must be"),
        (lambda x: x.update(alpha=x["alpha"][:, :, :-1]), "alpha must be"),
        (lambda x: x.update(initial_state=torch.zeros(1, 1, 3, 3, dtype=torch.float64)), "initial_state must be"),
        (lambda x: x.update(q=x["q"][0]), "q must be"),
    ],
)
def test_bad_shapes_are_rejected_with_the_expected_layout(change, message):
    x = make_inputs("delta_rule", 1, 1, 4, 3, 2, with_state=True, requires_grad=False)
    change(x)
    with pytest.raises(ValueError, match=message):
        kernels.delta_rule(x["q"], x["k"], x["v"], x["beta"], x["alpha"], initial_state=x["initial_state"])


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_chunk_size_is_rejected(bad):
    x = make_inputs("delta_rule", 1, 1, 4, 3, requires_grad=False)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        kernels.delta_rule(x["q"], x["k"], x["v"], x["beta"], impl="chunk", chunk_size=bad)


# --- under torch.func.vmap (seed packs run the cells vectorised over members) ---------------


@pytest.mark.parametrize("op", ["delta_rule", "dplr_scan", "ssd_scan"])
@pytest.mark.parametrize("strong_decay", [False, True])
def test_chunk_form_under_vmap_equals_each_member_alone(op, strong_decay):
    names = {
        "delta_rule": ("q", "k", "v", "beta", "alpha"),
        "dplr_scan": ("r", "k", "v", "w", "kappa", "a"),
        "ssd_scan": ("x", "a", "b", "c"),
    }[op] + ("initial_state",)
    decay_name = {"delta_rule": "alpha", "dplr_scan": "w", "ssd_scan": "a"}[op]
    fn = getattr(kernels, op)
    members = [make_inputs(op, 2, 2, 21, 5, 4, with_state=True, seed=30 + m, requires_grad=False) for m in range(3)]
    if strong_decay:  # one member's zero decay sends the whole pack down the segment-product path
        members[1][decay_name][0, 0, 7] = 0.0
    stacked = [torch.stack([m[n] for m in members]).requires_grad_() for n in names]
    packed = torch.func.vmap(lambda *xs: fn(*xs[:-1], impl="chunk", initial_state=xs[-1], chunk_size=8))(*stacked)
    g = torch.Generator().manual_seed(0)
    cot = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in packed]
    packed_grads = torch.autograd.grad(packed, stacked, cot)
    for i, m in enumerate(members):
        alone = {n: m[n].clone().requires_grad_() for n in names}
        o, s = fn(*(alone[n] for n in names[:-1]), impl="naive", initial_state=alone["initial_state"])
        grads = torch.autograd.grad((o, s), [alone[n] for n in names], (cot[0][i], cot[1][i]))
        torch.testing.assert_close(packed[0][i], o, rtol=0, atol=1e-10)
        torch.testing.assert_close(packed[1][i], s, rtol=0, atol=1e-10)
        for name, pg, gr in zip(names, packed_grads, grads):
            torch.testing.assert_close(pg[i], gr, rtol=0, atol=1e-9, msg=f"grad of {name}")


def test_auto_never_picks_triton_under_vmap():
    """Seed packs run cells under vmap; the Triton autograd functions have no batching rule."""
    from kernels.dispatch import is_transformed, resolve_impl

    x = torch.zeros(2, 3)
    seen = []

    def probe(t):
        seen.append(is_transformed(t))
        return t

    torch.func.vmap(probe)(x)
    assert seen == [True] and not is_transformed(x)
    assert resolve_impl("delta_rule", "auto", torch.device("cpu"), transformed=True) == "chunk"
