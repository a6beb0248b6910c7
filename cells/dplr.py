"""RWKV-7-style diagonal-plus-rank-1 mixers: dg_rank (eqs. 3-4 of seed paper 001) and
its diagonal ablation dg_diag (``rank1=False``: a_t = 0, same parameters).

Per token (x pre-normed by the harness), ``H`` heads of ``dk = dv = d/H``::

    r, k, v   = split(W_rkv x)                     fused projection, no bias
    r, k, v   = conv(r, k, v)                      width-`conv` causal depthwise (pre-activation)
    r, k, v   = silu(r), silu(k), silu(v)
    kappa_hat = normalize(k * k_k)                 removal key; k_k learned per channel, init 1
    r, k      = r / |r|, k / |k|                   per head (k is the write key)
    w         = exp(-0.606531 * sigmoid(W_w x + b_w))   vector decay in (0.545, 1), ~0.95 at init
    a         = sigmoid(W_a x + b_a)               in-context rate in (0, 1)^dk (zeroed if not rank1)
    A_t = diag(w_t) - (a_t * kappa_hat_t) kappa_hat_t^T
    S_t = S_{t-1} A_t + v_t k_t^T,   o_t = S_t r_t
    y = W_o o                                      no bias

The decay bound is RWKV-7's: it keeps every per-step transition well inside the unit ball.
With ``w = 1`` and ``a = beta * 1`` the transition is exactly the delta rule's
``I - beta k k^T``. The recurrence is ``kernels.dplr_scan``; ``a`` is passed as exact zeros
for the diagonal ablation, so ``W_a`` exists (same parameter count) and gets no gradient.
"""

from __future__ import annotations

import math


import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from cells.conv import make_conv
from cells.delta import RankOneMixer, merge_heads, split_heads
from cells.family import Family, check_heads, knob_mixer

DECAY_SCALE = 0.606531  # exp(-0.606531) = 0.545: RWKV-7's lower bound on the per-step decay
INIT_DECAY = 0.95


def _decay_bias_init() -> float:
    """Bias giving w = INIT_DECAY at zero input: sigmoid(b) = -log(w) / DECAY_SCALE."""
    s = -math.log(INIT_DECAY) / DECAY_SCALE
    return math.log(s / (1.0 - s))


class DPLRMixer(RankOneMixer):
    """dg_rank (``rank1=True``) or dg_diag (``rank1=False``); armed when ``conv > 1``."""

    def __init__(self, d_model: int, *, heads: int, conv: int, rank1: bool, impl: str) -> None:
        super().__init__(d_model, heads, impl)
        self.rank1 = rank1
        self.rkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.conv = make_conv(3 * d_model, conv, bias=False)
        self.k_k = nn.Parameter(torch.ones(d_model))
        self.decay = nn.Linear(d_model, d_model)
        nn.init.constant_(self.decay.bias, _decay_bias_init())
        self.rate = nn.Linear(d_model, d_model)
        nn.init.zeros_(self.rate.bias)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rkv = self.rkv(x)
        if self.conv is not None:
            rkv = self.conv(rkv)
        r, k, v = F.silu(rkv).chunk(3, dim=-1)
        kappa = F.normalize(split_heads(k * self.k_k, self.heads), dim=-1)
        r = F.normalize(split_heads(r, self.heads), dim=-1)
        k = F.normalize(split_heads(k, self.heads), dim=-1)
        v = split_heads(v, self.heads)
        w = split_heads(torch.exp(-DECAY_SCALE * torch.sigmoid(self.decay(x))), self.heads)
        if self.rank1:
            a = split_heads(torch.sigmoid(self.rate(x)), self.heads)
        else:
            a = torch.zeros_like(kappa)
        o, _ = kernels.dplr_scan(r, k, v, w, kappa, a, impl=self.impl)
        return self.out(merge_heads(o).to(x.dtype))


FAMILY = Family("dplr", knob_mixer(DPLRMixer, "heads", "conv", "rank1", "impl"), check_heads)
