"""Delta-rule mixers: DeltaNet (eq. 1) and Gated DeltaNet (eq. 2) of seed paper 001.

Per token (x already pre-normed by the harness), with ``H`` heads of ``dk = dv = d/H``::

    q, k, v = split(W_qkv x)                      fused projection, no bias
    q, k, v = conv(q, k, v)                        width-`conv` causal depthwise (pre-activation)
    q, k, v = silu(q), silu(k), silu(v)
    q, k    = q / |q|, k / |k|                     per head
    beta    = sigmoid(W_b x + b_b)                 (B, H, T)
    alpha   = sigmoid(W_a x + b_a), b_a = 3        gated only (decay ~0.95 at init)
    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,   o_t = S_t q_t
    y = W_o o                                      no bias

The recurrence is ``kernels.delta_rule`` (``impl`` picks its form). State per head
``dv x dk``; per layer ``H * dk * dv = d^2 / H`` elements (1,024 at d = 32, one head).
"""

from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from cells.conv import make_conv
from cells.family import Family, check_heads, knob_mixer

DECAY_BIAS_INIT = 3.0


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(B, T, H*D) -> (B, H, T, D)``."""
    b, t, hd = x.shape
    return x.reshape(b, t, heads, hd // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, D) -> (B, T, H*D)``."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


class RankOneMixer(nn.Module):
    """What the rank-1 cells (delta rule, DPLR) share: ``heads`` split ``d_model`` into heads of
    ``dk = dv = d/H``, each with a ``dv x dk`` state."""

    causal = True

    def __init__(self, d_model: int, heads: int, impl: str) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
        self.d_model, self.heads, self.impl = d_model, heads, impl

    def state_elements(self) -> int:
        dk = self.d_model // self.heads
        return self.heads * dk * dk


class DeltaMixer(RankOneMixer):
    """DeltaNet (``decay=False``) or Gated DeltaNet (``decay=True``); armed when ``conv > 1``."""

    def __init__(self, d_model: int, *, heads: int, conv: int, decay: bool, impl: str) -> None:
        super().__init__(d_model, heads, impl)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.conv = make_conv(3 * d_model, conv, bias=False)
        self.beta = nn.Linear(d_model, heads)
        self.alpha = nn.Linear(d_model, heads) if decay else None
        if self.alpha is not None:
            nn.init.constant_(self.alpha.bias, DECAY_BIAS_INIT)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        if self.conv is not None:
            qkv = self.conv(qkv)
        q, k, v = (split_heads(z, self.heads) for z in F.silu(qkv).chunk(3, dim=-1))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta = torch.sigmoid(self.beta(x)).transpose(1, 2)
        alpha = torch.sigmoid(self.alpha(x)).transpose(1, 2) if self.alpha is not None else None
        o, _ = kernels.delta_rule(q, k, v, beta, alpha, impl=self.impl)
        return self.out(merge_heads(o).to(x.dtype))


FAMILY = Family("delta", knob_mixer(DeltaMixer, "heads", "conv", "decay", "impl"), check_heads)
