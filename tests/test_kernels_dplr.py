"""The DPLR scan (RWKV-7 style): naive reference, chunk form, and properties.

Checks: the reference against the equation with explicit transition matrices; the chunk
form against the reference (output, state, every gradient, fp64, odd shapes) on both of
its paths (factorised decays and explicit segment products); a = 0 against an independently
computed diagonal scan; equivalence with the delta rule; state carry; bf16.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.dplr import dplr_scan_chunk, dplr_scan_naive
from kernels.testing import make_inputs
from kernel_checks import (
    assert_chunk_matches_naive,
    assert_bf16_close_to_fp32,
    assert_exact_on_unfactorable_decays,
    assert_fp32_chunk_close_to_fp64,
    assert_state_carry_equals_one_pass,
)

B, H, T, DK, DV = 2, 3, 37, 6, 5
NAMES = ("r", "k", "v", "w", "kappa", "a")


def _args(x):
    return [x[n] for n in NAMES]


def test_naive_matches_the_equation_with_explicit_matrices():
    x = make_inputs("dplr_scan", 2, 2, 9, 4, 3, with_state=True, requires_grad=False)
    r, k, v, w, kap, a = _args(x)
    want_o = torch.empty(2, 2, 9, 3, dtype=torch.float64)
    want_s = x["initial_state"].clone()
    for i in range(2):
        for j in range(2):
            s = want_s[i, j]
            for t in range(9):
                trans = torch.diag(w[i, j, t]) - (a[i, j, t] * kap[i, j, t])[:, None] @ kap[i, j, t][None, :]
                s = s @ trans + v[i, j, t][:, None] @ k[i, j, t][None, :]
                want_o[i, j, t] = s @ r[i, j, t]
            want_s[i, j] = s
    got_o, got_s = dplr_scan_naive(r, k, v, w, kap, a, initial_state=x["initial_state"])
    torch.testing.assert_close(got_o, want_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_s, want_s, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 5, 8, 16, 64])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_matches_naive_outputs_state_and_all_gradients(chunk_size, with_state):
    x = make_inputs("dplr_scan", B, H, T, DK, DV, with_state=with_state, seed=chunk_size)
    assert_chunk_matches_naive("dplr_scan", dplr_scan_naive, dplr_scan_chunk, x, NAMES, chunk_size)


@pytest.mark.parametrize("chunk_size", [4, 16])
def test_chunk_exact_when_decays_are_zero_or_tiny(chunk_size):
    # w = 0 in one channel and 1e-200 in a whole step defeat the D0[t] / D0[s]
    # factorisation: the segment-product path must take over and stay exact.
    x = make_inputs("dplr_scan", B, H, T, DK, DV, with_state=True, seed=11)
    zero, tiny = (0, 1, 10, 2), (1, 2, 3)
    assert_exact_on_unfactorable_decays("dplr_scan", dplr_scan_naive, dplr_scan_chunk, x, "w", zero, tiny, chunk_size)


@pytest.mark.parametrize("impl", ["naive", "chunk"])
def test_zero_rate_is_an_independent_diagonal_scan(impl):
    # With a = 0: S_t = sum_{s<=t} v_s (k_s * prod_{s<j<=t} w_j)^T + S_0 diag(prod_{j<=t} w_j).
    # Computed here in closed form from log-decay cumulative sums, with no recurrence at all.
    x = make_inputs("dplr_scan", B, H, T, DK, DV, with_state=True, seed=12, requires_grad=False)
    r, k, v, w, kap, _ = _args(x)
    zero = torch.zeros_like(w)
    got_o, got_s = kernels.dplr_scan(r, k, v, w, kap, zero, impl=impl, initial_state=x["initial_state"], chunk_size=8)
    logw = torch.log(w).cumsum(dim=2)  # L[t] = sum_{j<=t} log w_j
    t_idx = torch.arange(T)
    causal = (t_idx[None, :] <= t_idx[:, None]).to(torch.float64)  # [t, s]
    decay = torch.exp(logw[:, :, :, None, :] - logw[:, :, None, :, :]) * causal[..., None]  # [t, s, i]
    scores = torch.einsum("bhti,bhtsi,bhsi->bhts", r, decay, k)
    want_o = scores @ v + torch.einsum("bhvi,bhti,bhti->bhtv", x["initial_state"], torch.exp(logw), r)
    want_s = (
        torch.einsum("bhsv,bhsi,bhsi->bhvi", v, k, torch.exp(logw[:, :, -1:] - logw))
        + x["initial_state"] * torch.exp(logw[:, :, -1])[:, :, None, :]
    )
    torch.testing.assert_close(got_o, want_o, rtol=0, atol=1e-10)
    torch.testing.assert_close(got_s, want_s, rtol=0, atol=1e-10)


@pytest.mark.parametrize("impl", ["naive", "chunk"])
def test_delta_rule_is_the_special_case_w_alpha_kappa_k(impl):
    # alpha S (I - beta k k^T) + beta v k^T  ==  S (diag(alpha) - (alpha beta k) k^T) + (beta v) k^T
    x = make_inputs("delta_rule", B, H, T, DK, DV, with_state=True, seed=13, requires_grad=False)
    q, k, v, beta, alpha = (x[n] for n in ("q", "k", "v", "beta", "alpha"))
    want = kernels.delta_rule(q, k, v, beta, alpha, impl="naive", initial_state=x["initial_state"])
    ones = torch.ones(B, H, T, DK, dtype=torch.float64)
    got = kernels.dplr_scan(
        q,
        k,
        beta[..., None] * v,
        alpha[..., None] * ones,
        k,
        (alpha * beta)[..., None] * ones,
        impl=impl,
        initial_state=x["initial_state"],
        chunk_size=8,
    )
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("split", [16, 21])
def test_chunk_state_carry_equals_one_pass(split):
    x = make_inputs("dplr_scan", B, H, T, DK, DV, with_state=True, seed=14, requires_grad=False)
    assert_state_carry_equals_one_pass(kernels.dplr_scan, _args(x), x["initial_state"], split)


def test_fp32_chunk_close_to_fp64_naive():
    x64 = make_inputs("dplr_scan", B, H, 64, 16, 16, with_state=True, seed=15)
    x32 = make_inputs("dplr_scan", B, H, 64, 16, 16, with_state=True, seed=15, dtype=torch.float32)
    assert_fp32_chunk_close_to_fp64("dplr_scan", dplr_scan_naive, kernels.dplr_scan, x64, x32)


@pytest.mark.parametrize("impl", ["naive", "chunk"])
def test_bf16_inputs_run_forward_backward_close_to_fp32(impl):
    x16 = make_inputs("dplr_scan", 2, 2, 40, 16, 16, with_state=True, seed=16, dtype=torch.bfloat16)
    assert_bf16_close_to_fp32("dplr_scan", kernels.dplr_scan, x16, impl)


def test_bad_shapes_are_rejected():
    x = make_inputs("dplr_scan", 1, 1, 4, 3, 2, requires_grad=False)
    with pytest.raises(ValueError, match="kappa must be"):
        kernels.dplr_scan(x["r"], x["k"], x["v"], x["w"], x["kappa"][..., :2], x["a"])
    with pytest.raises(ValueError, match="w must be"):
        kernels.dplr_scan(x["r"], x["k"], x["v"], x["w"][..., 0], x["kappa"], x["a"])
