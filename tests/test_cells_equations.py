"""Each mixer against a brute-force transcription of its equations, computed from the
mixer's own parameters with plain loops (no ``kernels`` call, ``F.conv1d`` for the conv)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import cells
from cells.conv import causal_conv_reference
from cells.dplr import DECAY_SCALE
from cells.linear_mamba import SHARED

B, T, D = 2, 11, 8


def _mixer(arm: str, **knobs):
    torch.manual_seed(0)
    model = cells.build(arm, 7, d_model=D, **knobs).double()
    return model.blocks[0].mixer


def _x(seed=1):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _conv(m, z):
    return causal_conv_reference(z, m.conv.weight, m.conv.bias) if m.conv is not None else z


@pytest.mark.parametrize("arm,heads", [("deltanet", 1), ("gated_deltanet", 2), ("armed_gdn", 2)])
def test_delta_mixer_is_eq_1_and_2(arm, heads):
    m = _mixer(arm, heads=heads)
    x = _x()
    dk = D // heads
    q, k, v = F.silu(_conv(m, x @ m.qkv.weight.T)).split(D, dim=-1)
    beta = torch.sigmoid(m.beta(x))
    alpha = torch.sigmoid(m.alpha(x)) if m.alpha is not None else torch.ones_like(beta)
    out = torch.zeros(B, T, D, dtype=torch.float64)
    eye = torch.eye(dk, dtype=torch.float64)
    for b in range(B):
        for h in range(heads):
            sl = slice(h * dk, (h + 1) * dk)
            s = torch.zeros(dk, dk, dtype=torch.float64)
            for t in range(T):
                qt, kt, vt = F.normalize(q[b, t, sl], dim=0), F.normalize(k[b, t, sl], dim=0), v[b, t, sl]
                bt, at = beta[b, t, h], alpha[b, t, h]
                s = at * s @ (eye - bt * torch.outer(kt, kt)) + bt * torch.outer(vt, kt)
                out[b, t, sl] = s @ qt
    torch.testing.assert_close(m(x), out @ m.out.weight.T, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("arm", ["dg_rank", "dg_diag", "armed_dg_rank"])
def test_dplr_mixer_is_eqs_3_and_4(arm):
    m = _mixer(arm, heads=2)
    x = _x(2)
    dk = D // 2
    r, k, v = F.silu(_conv(m, x @ m.rkv.weight.T)).split(D, dim=-1)
    w = torch.exp(-DECAY_SCALE * torch.sigmoid(m.decay(x)))
    a = torch.sigmoid(m.rate(x)) if m.rank1 else torch.zeros_like(w)
    kk = k * m.k_k
    out = torch.zeros(B, T, D, dtype=torch.float64)
    for b in range(B):
        for h in range(2):
            sl = slice(h * dk, (h + 1) * dk)
            s = torch.zeros(dk, dk, dtype=torch.float64)
            for t in range(T):
                kap = F.normalize(kk[b, t, sl], dim=0)
                trans = torch.diag(w[b, t, sl]) - torch.outer(a[b, t, sl] * kap, kap)
                s = s @ trans + torch.outer(v[b, t, sl], F.normalize(k[b, t, sl], dim=0))
                out[b, t, sl] = s @ F.normalize(r[b, t, sl], dim=0)
    torch.testing.assert_close(m(x), out @ m.out.weight.T, rtol=1e-9, atol=1e-11)
    # Decay is a vector in RWKV-7's bounds.
    assert (w > math.exp(-DECAY_SCALE)).all() and (w < 1).all()


@pytest.mark.parametrize("arm,heads", [("mamba2_ref", 1), ("mamba2_ref", 2), ("mamba2_ref_noconv", 4)])
def test_mamba2_mixer_is_eq_5(arm, heads):
    m = _mixer(arm, heads=heads, d_state=3)
    u = _x(3)
    di, n = m.d_inner, m.d_state
    p = di // heads
    z, xbc, dt = (u @ m.in_proj.weight.T).split([di, di + 2 * n, heads], dim=-1)
    xbc = F.silu(causal_conv_reference(xbc, m.conv.weight, m.conv.bias))
    x, bm, cm = xbc.split([di, n, n], dim=-1)
    dt = F.softplus(dt + m.dt_bias)
    a = torch.exp(-dt * torch.exp(m.A_log))
    y = torch.zeros(B, T, di, dtype=torch.float64)
    for b in range(B):
        for h in range(heads):
            sl = slice(h * p, (h + 1) * p)
            state = torch.zeros(p, n, dtype=torch.float64)
            for t in range(T):
                state = a[b, t, h] * state + torch.outer(dt[b, t, h] * x[b, t, sl], bm[b, t])
                y[b, t, sl] = state @ cm[b, t] + m.D[h] * x[b, t, sl]
    y = y * F.silu(z)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float64).eps) * m.norm.weight
    torch.testing.assert_close(m(u), y @ m.out_proj.weight.T, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("pattern", ["mha", "mva", "mqa", "mka"])
@pytest.mark.parametrize("gate", [False, True])
def test_linear_mamba_patterns(pattern, gate):
    heads, n = 2, 3
    m = _mixer("linear_mamba", heads=heads, d_state=n, pattern=pattern, gate=gate)
    u = _x(4)
    p = D // heads
    shared = SHARED[pattern]
    widths = [p if "x" in shared else D, n if "b" in shared else heads * n, n if "c" in shared else heads * n]
    assert m.in_proj.weight.shape[0] == sum(widths)
    x, bm, cm = _conv(m, u @ m.in_proj.weight.T).split(widths, dim=-1)

    def head(z, name, h, width):
        return z[..., :width] if name in shared else z[..., h * width : (h + 1) * width]

    y = torch.zeros(B, T, D, dtype=torch.float64)
    for h in range(heads):
        xh, bh, ch = head(x, "x", h, p), head(bm, "b", h, n), head(cm, "c", h, n)
        # a = 1: y_t = sum_{s<=t} x_s (b_s . c_t), no decay.
        scores = torch.einsum("bsn,btn->bts", bh, ch).tril()
        y[..., h * p : (h + 1) * p] = scores @ xh
    if gate:
        y = y * F.silu(u @ m.gate.weight.T)
    torch.testing.assert_close(m(u), y @ m.out.weight.T, rtol=1e-9, atol=1e-11)
    distinct = 1 if pattern == "mqa" else heads
    assert m.state_elements() == distinct * p * n


def test_attention_matches_explicit_softmax_and_rotary_is_relative():
    m = _mixer("attention", heads=2, positions="rotary")
    u = _x(5)
    q, k, v = (u @ m.qkv.weight.T).split(D, dim=-1)
    hd = D // 2
    half = hd // 2
    freqs = 10000.0 ** (-torch.arange(half, dtype=torch.float64) * 2 / hd)
    out = torch.zeros(B, T, D, dtype=torch.float64)

    def rot(vec, pos):
        ang = pos * freqs
        x1, x2 = vec[:half], vec[half:]
        return torch.cat([x1 * torch.cos(ang) - x2 * torch.sin(ang), x1 * torch.sin(ang) + x2 * torch.cos(ang)])

    for b in range(B):
        for h in range(2):
            sl = slice(h * hd, (h + 1) * hd)
            for t in range(T):
                logits = torch.stack([rot(q[b, t, sl], t) @ rot(k[b, s, sl], s) for s in range(t + 1)])
                wts = torch.softmax(logits / math.sqrt(hd), dim=0)
                out[b, t, sl] = wts @ v[b, : t + 1, sl]
    torch.testing.assert_close(m(u), out @ m.out.weight.T, rtol=1e-9, atol=1e-11)
    # Rotary scores depend only on the offset t - s.
    qv, kv = torch.randn(hd, dtype=torch.float64), torch.randn(hd, dtype=torch.float64)
    assert torch.isclose(rot(qv, 7) @ rot(kv, 3), rot(qv, 4) @ rot(kv, 0))
