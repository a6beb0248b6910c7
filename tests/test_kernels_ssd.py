"""The Mamba-2 SSD scan: naive reference, chunk form, and properties.

Checks: the reference against the quadratic (attention-like) closed form computed
independently; equivalence with the DPLR scan at a = 0; bad shapes. The chunk form against
the reference (the checks every operator shares: output, state, every gradient, both paths,
state carry, bf16) is ``test_kernels_chunk_form.py``.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.ssd import ssd_scan_naive
from kernels.testing import make_inputs

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


def test_bad_shapes_are_rejected():
    x = make_inputs("ssd_scan", 1, 1, 4, 3, 2, requires_grad=False)
    with pytest.raises(ValueError, match="c must be"):
        kernels.ssd_scan(x["x"], x["a"], x["b"], x["c"][..., :2])
    with pytest.raises(ValueError, match="a must be"):
        kernels.ssd_scan(x["x"], x["a"][..., None], x["b"], x["c"])
