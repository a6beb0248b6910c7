"""The DPLR scan (RWKV-7 style): naive reference, chunk form, and properties.

Checks: the reference against the equation with explicit transition matrices; a = 0 against
an independently computed diagonal scan; equivalence with the delta rule; bad shapes. The
chunk form against the reference (the checks every operator shares: output, state, every
gradient, both paths, state carry, fp32, bf16) is ``test_kernels_chunk_form.py``.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.dplr import dplr_scan_naive
from kernels.testing import make_inputs

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


def test_bad_shapes_are_rejected():
    x = make_inputs("dplr_scan", 1, 1, 4, 3, 2, requires_grad=False)
    with pytest.raises(ValueError, match="kappa must be"):
        kernels.dplr_scan(x["r"], x["k"], x["v"], x["w"], x["kappa"][..., :2], x["a"])
    with pytest.raises(ValueError, match="w must be"):
        kernels.dplr_scan(x["r"], x["k"], x["v"], x["w"][..., 0], x["kappa"], x["a"])
