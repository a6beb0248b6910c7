"""The simplified ("linear") Mamba of the recall scaling-law study (seed paper 002, §3 and
Appendix H): no discretisation, no nonlinearity, no bias, no norm; the state transition
is the identity (``a_t = 1``); projections and width-``conv`` causal convolutions produce
the SSM inputs ``x^``, ``B``, ``C`` directly from the embedding (no expansion)::

    x^, B, C = conv(W_x u), conv(W_B u), conv(W_C u)
    H_t = H_{t-1} + x^_t B_t^T,   y_t = H_t C_t            (kernels.ssd_scan with a = 1)
    y = y * silu(W_z u)    (gate=True only);   out = W_o y

``M`` heads split the value stream into ``P = D / M`` channels per head. The multi-head
pattern says which of ``x^``, ``B``, ``C`` one projection shares across heads (Mamba-2's
names; C plays the query, B the key, x^ the value):

    mha   nothing shared                 M states of P x N
    mva   B and C shared (x^ per head)   M states of P x N
    mqa   x^ and B shared (C per head)   1 state of P x N, read by M queries
    mka   x^ and C shared (B per head)   M states of P x N, read by one query

``state_elements`` counts the distinct states (mqa's heads all hold the same one).
Layers stack through the harness's residual stream; use ``norm: false`` and ``mlp: false``
(the arm's defaults) for the paper's fully linear model.
"""

from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from cells.conv import make_conv
from cells.family import Family, check_heads, knob_mixer

PATTERNS = ("mha", "mva", "mqa", "mka")
# Which streams a pattern shares across heads.
SHARED: dict[str, frozenset[str]] = {
    "mha": frozenset(),
    "mva": frozenset({"b", "c"}),
    "mqa": frozenset({"x", "b"}),
    "mka": frozenset({"x", "c"}),
}


class LinearMambaMixer(nn.Module):
    """One simplified Mamba layer with a multi-head sharing pattern."""

    causal = True

    def __init__(
        self, d_model: int, *, d_state: int, heads: int, pattern: str, conv: int, gate: bool, impl: str
    ) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
        if pattern not in PATTERNS:
            raise ValueError(f"unknown pattern {pattern!r}; expected one of {', '.join(PATTERNS)}")
        self.d_model, self.d_state, self.heads, self.pattern, self.impl = d_model, d_state, heads, pattern, impl
        self.head_dim = d_model // heads
        shared = SHARED[pattern]
        self.widths = {
            "x": self.head_dim if "x" in shared else d_model,
            "b": d_state if "b" in shared else heads * d_state,
            "c": d_state if "c" in shared else heads * d_state,
        }
        total = sum(self.widths.values())
        self.in_proj = nn.Linear(d_model, total, bias=False)
        self.conv = make_conv(total, conv, bias=False)
        self.gate = nn.Linear(d_model, d_model, bias=False) if gate else None
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        b, t, _ = u.shape
        proj = self.in_proj(u)
        if self.conv is not None:
            proj = self.conv(proj)
        x, bm, cm = proj.split([self.widths["x"], self.widths["b"], self.widths["c"]], dim=-1)
        shared = SHARED[self.pattern]
        x = self._split(x, "x" in shared)
        bm = self._split(bm, "b" in shared)
        cm = self._split(cm, "c" in shared)
        ones = u.new_ones(b, self.heads, t)
        y, _ = kernels.ssd_scan(x, ones, bm, cm, impl=self.impl)
        y = y.transpose(1, 2).reshape(b, t, self.d_model).to(u.dtype)
        if self.gate is not None:
            y = y * F.silu(self.gate(u))
        return self.out(y)

    def _split(self, z: torch.Tensor, shared: bool) -> torch.Tensor:
        """``(B, T, W)`` -> ``(B, M, T, W')``: a shared stream is broadcast to every head."""
        b, t, w = z.shape
        if shared:
            return z.unsqueeze(1).expand(b, self.heads, t, w)
        return z.reshape(b, t, self.heads, w // self.heads).transpose(1, 2)

    def state_elements(self) -> int:
        shared = SHARED[self.pattern]
        distinct = 1 if ("x" in shared and "b" in shared) else self.heads
        return distinct * self.head_dim * self.d_state


FAMILY = Family(
    "linear_mamba", knob_mixer(LinearMambaMixer, "d_state", "heads", "pattern", "conv", "gate", "impl"), check_heads
)
