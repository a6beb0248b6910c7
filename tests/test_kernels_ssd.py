"""The Mamba-2 SSD scan: naive reference, chunk form, and properties.

Checks: the reference against the quadratic (attention-like) closed form computed
independently; the chunk form against the reference (output, state, every gradient, fp64,
odd shapes) on both paths; equivalence with the DPLR scan at a = 0; state carry; bf16.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.chunking import factorable
from kernels.ssd import ssd_scan_chunk, ssd_scan_naive
from kernels.testing import assert_matches_reference, make_inputs, max_abs_differences, run_with_grads

B, H, T, N, P = 2, 3, 37, 6, 5
TOL = 1e-8
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
    expected = {"out", "state"} | {f"grad_{n}" for n in NAMES}
    expected |= {"grad_initial_state"} if with_state else set()
    assert_matches_reference(ssd_scan_naive, ssd_scan_chunk, "ssd_scan", x, expected, TOL, chunk_size=chunk_size)


@pytest.mark.parametrize("chunk_size", [4, 16])
def test_chunk_exact_when_decays_are_zero_or_tiny(chunk_size):
    x = make_inputs("ssd_scan", B, H, T, N, P, with_state=True, seed=21)
    with torch.no_grad():
        x["a"][0, 1, 10] = 0.0
        x["a"][1, 2, 3:6] = 1e-200
    assert not factorable(torch.cumprod(x["a"].detach(), dim=-1))
    ref = run_with_grads(ssd_scan_naive, "ssd_scan", x)
    got = run_with_grads(ssd_scan_chunk, "ssd_scan", x, chunk_size=chunk_size)
    diffs = max_abs_differences(got, ref)
    assert max(diffs.values()) <= TOL, diffs


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
    args = _args(x)
    full_y, full_h = kernels.ssd_scan(*args, impl="chunk", initial_state=x["initial_state"], chunk_size=8)
    y1, h1 = kernels.ssd_scan(
        *(t[:, :, :split] for t in args), impl="chunk", initial_state=x["initial_state"], chunk_size=8
    )
    y2, h2 = kernels.ssd_scan(*(t[:, :, split:] for t in args), impl="chunk", initial_state=h1, chunk_size=8)
    torch.testing.assert_close(torch.cat([y1, y2], dim=2), full_y, rtol=0, atol=1e-12)
    torch.testing.assert_close(h2, full_h, rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", ["naive", "chunk"])
def test_bf16_inputs_run_forward_backward_close_to_fp32(impl):
    x16 = make_inputs("ssd_scan", 2, 2, 40, 16, 16, with_state=True, seed=24, dtype=torch.bfloat16)
    x32 = {n: t.detach().float().requires_grad_() for n, t in x16.items()}
    got = run_with_grads(kernels.ssd_scan, "ssd_scan", x16, impl=impl, chunk_size=16)
    ref = run_with_grads(kernels.ssd_scan, "ssd_scan", x32, impl=impl, chunk_size=16)
    assert got["out"].dtype == torch.bfloat16 and got["state"].dtype == torch.float32
    for key in ref:
        scale = ref[key].abs().max().item()
        assert (got[key].float() - ref[key]).abs().max().item() <= 2e-2 * max(scale, 1.0), key


def test_bad_shapes_are_rejected():
    x = make_inputs("ssd_scan", 1, 1, 4, 3, 2, requires_grad=False)
    with pytest.raises(ValueError, match="c must be"):
        kernels.ssd_scan(x["x"], x["a"], x["b"], x["c"][..., :2])
    with pytest.raises(ValueError, match="a must be"):
        kernels.ssd_scan(x["x"], x["a"][..., None], x["b"], x["c"])
