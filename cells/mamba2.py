"""Mamba-2 reference mixer (``mamba2_ref``): the SSD recurrence in pure PyTorch.

Follows the official Mamba-2 block (one group, ``H`` heads of ``P = d_inner / H``)::

    z, x, B, C, dt = split(W_in u)                 d_inner, d_inner, N, N, H; no bias
    x, B, C        = silu(conv(x, B, C))            width-`conv` causal depthwise, WITH bias
    dt = softplus(dt + dt_bias);  A = -exp(A_log)   per head
    a_t = exp(dt_t * A)                             scalar decay per head in (0, 1)
    H_t = a_t H_{t-1} + (dt_t x_t) B_t^T,  y_t = H_t C_t      (kernels.ssd_scan, eq. 5)
    y = y + D * x;   y = RMSNorm(y * silu(z));   out = W_out y

Explicit state ``H_t`` of shape ``(P, N)`` per head: ``d_inner * d_state`` elements per
layer (64 x 16 = 1,024 at d = 32, expand 2, d_state 16). ``conv = 1`` keeps the conv module
at width 1 (per-channel scale and bias): the true toggle of ``mamba2_ref_noconv``.
Initialisation follows mamba_ssm: dt log-uniform in [1e-3, 1e-1], A uniform in [1, 16], D = 1.
"""

from __future__ import annotations

import math


import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from cells.conv import ShortConv
from cells.family import Family, Knobs, knob_mixer, where

DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4
A_INIT_RANGE = (1.0, 16.0)


class Mamba2Mixer(nn.Module):
    """The Mamba-2 block's mixer with an explicit ``d_state``."""

    causal = True

    def __init__(self, d_model: int, *, d_state: int, expand: int, heads: int, conv: int, impl: str) -> None:
        super().__init__()
        d_inner = expand * d_model
        if d_inner % heads:
            raise ValueError(f"d_inner {d_inner} (expand x d_model) is not divisible by heads {heads}")
        self.d_inner, self.d_state, self.heads, self.impl = d_inner, d_state, heads, impl
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * d_state + heads, bias=False)
        self.conv = ShortConv(d_inner + 2 * d_state, conv, bias=True)
        dt = torch.exp(torch.rand(heads) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN))
        dt = dt.clamp(min=DT_FLOOR)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.A_log = nn.Parameter(torch.log(torch.empty(heads).uniform_(*A_INIT_RANGE)))
        self.D = nn.Parameter(torch.ones(heads))
        self.norm = nn.RMSNorm(d_inner)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        b, t, _ = u.shape
        h, p, n = self.heads, self.d_inner // self.heads, self.d_state
        z, xbc, dt = self.in_proj(u).split([self.d_inner, self.d_inner + 2 * n, h], dim=-1)
        xbc = F.silu(self.conv(xbc))
        x, bmat, cmat = xbc.split([self.d_inner, n, n], dim=-1)
        # The decay is an exponential of a sum: computed in at least float32 under autocast.
        dt = F.softplus(dt.to(torch.promote_types(dt.dtype, torch.float32)) + self.dt_bias)  # (B, T, H)
        a = torch.exp(dt * -torch.exp(self.A_log))  # (B, T, H)
        xh = x.reshape(b, t, h, p).transpose(1, 2)  # (B, H, T, P)
        x_in = xh * dt.transpose(1, 2).unsqueeze(-1)
        bh = bmat.unsqueeze(1).expand(b, h, t, n)
        ch = cmat.unsqueeze(1).expand(b, h, t, n)
        y, _ = kernels.ssd_scan(x_in, a.transpose(1, 2), bh, ch, impl=self.impl)
        y = y + xh * self.D.view(1, h, 1, 1)
        y = y.transpose(1, 2).reshape(b, t, self.d_inner)
        y = self.norm(y * F.silu(z))
        return self.out_proj(y)

    def state_elements(self) -> int:
        return self.d_inner * self.d_state


def _check(arm: str, k: Knobs, d: int) -> None:
    if (k["expand"] * d) % k["heads"]:
        raise ValueError(
            f"{where(arm, d)}: d_inner = expand * d_model = {k['expand'] * d} must be divisible by heads ({k['heads']})"
        )


FAMILY = Family("mamba2", knob_mixer(Mamba2Mixer, "d_state", "expand", "heads", "conv", "impl"), _check)
