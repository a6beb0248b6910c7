"""The Mamba-2 SSD scan: naive reference, chunk form, and properties.

Checks: the reference against the quadratic (attention-like) closed form computed
independently; the chunk form against the reference (output, state, every gradient, fp64,
odd shapes) on both paths; equivalence with the DPLR scan at a = 0; state carry; bf16.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.ssd import ssd_scan_chunk, ssd_scan_naive
from kernels.testing import make_inputs
from kernel_checks import (
    assert_chunk_matches_naive,
    assert_bf16_close_to_fp32,
    assert_exact_on_unfactorable_decays,
    assert_state_carry_equals_one_pass,
)

B, H, T, N, P = 2, 3, 37, 6, 5
NAMES = ("x", "a", "b", "c")


def _args(x):
    return [x[n] for n in NAMES]


def test_naive_matches_the_quadratic_closed_form():
    # y_t = sum_{s<=t} (prod_{s<j<=t} a_j) (c_t . b_s) x_s + (prod_{j<=t} a_j) H_0 c_t
    x = make_inputs("ssd_scan", B, H, T, N, P, with_state=True, seed=20, requires_grad=False)
    xs, a, b, c = _args(x)
    la = torch.log(a).cumsum(dim=-1)
    t_idx = torch.arange(T)
    causal = t_idx[None, :] <= t_idx[:, None]
    decay = torch.exp(la[..., :, None] - la[..., None, :]) * causal
    want_y = ((c @ b.transpose(-1, -2)) * decay) @ xs
    want_y = want_y + torch.exp(la)[..., None] * (c @ x["initial_state"].transpose(-1, -2))
    want_h = (xs * torch.exp(la[..., -1:] - la)[..., None]).transpose(-1, -2) @ b
    want_h = want_h + torch.exp(la[..., -1])[..., None, None] * x["initial_state"]
    got_y, got_h = ssd_scan_naive(xs, a, b, c, initial_state=x["initial_state"])
    torch.testing.assert_close(got_y, want_y, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_h, want_h, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 5, 8, 16, 64])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_matches_naive_outputs_state_and_all_gradients(chunk_size, with_state):
    x = make_inputs("ssd_scan", B, H, T, N, P, with_state=with_state, seed=chunk_size)
    assert_chunk_matches_naive("ssd_scan", ssd_scan_naive, ssd_scan_chunk, x, NAMES, chunk_size)


@pytest.mark.parametrize("chunk_size", [4, 16])
def test_chunk_exact_when_decays_are_zero_or_tiny(chunk_size):
    x = make_inputs("ssd_scan", B, H, T, N, P, with_state=True, seed=21)
    zero, tiny = (0, 1, 10), (1, 2, slice(3, 6))
    assert_exact_on_unfactorable_decays("ssd_scan", ssd_scan_naive, ssd_scan_chunk, x, "a", zero, tiny, chunk_size)


@pytest.mark.parametrize("impl", ["naive", "chunk"])
def test_equals_dplr_scan_with_scalar_decay_and_no_removal(impl):
    x = make_inputs("ssd_scan", B, H, T, N, P, with_state=True, seed=22, requires_grad=False)
    xs, a, b, c = _args(x)
    want = kernels.ssd_scan(xs, a, b, c, impl="naive", initial_state=x["initial_state"])
    w = a[..., None].expand(B, H, T, N)
    zero = torch.zeros(B, H, T, N, dtype=torch.float64)
    got = kernels.dplr_scan(c, b, xs, w, zero, zero, impl=impl, initial_state=x["initial_state"], chunk_size=8)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("split", [16, 23])
def test_chunk_state_carry_equals_one_pass(split):
    x = make_inputs("ssd_scan", B, H, T, N, P, with_state=True, seed=23, requires_grad=False)
    assert_state_carry_equals_one_pass(kernels.ssd_scan, _args(x), x["initial_state"], split)


@pytest.mark.parametrize("impl", ["naive", "chunk"])
def test_bf16_inputs_run_forward_backward_close_to_fp32(impl):
    x16 = make_inputs("ssd_scan", 2, 2, 40, 16, 16, with_state=True, seed=24, dtype=torch.bfloat16)
    assert_bf16_close_to_fp32("ssd_scan", kernels.ssd_scan, x16, impl)


def test_bad_shapes_are_rejected():
    x = make_inputs("ssd_scan", 1, 1, 4, 3, 2, requires_grad=False)
    with pytest.raises(ValueError, match="c must be"):
        kernels.ssd_scan(x["x"], x["a"], x["b"], x["c"][..., :2])
    with pytest.raises(ValueError, match="a must be"):
        kernels.ssd_scan(x["x"], x["a"][..., None], x["b"], x["c"])
