"""The mLSTM's raw read in the stabilised parallel (quadratic, attention-like) form."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels.mlstm.reference import EPS, _fp32


def raw_read_parallel(q, k, v, i, f) -> torch.Tensor:
    """Stock mLSTM read in the stabilised parallel form (xLSTM's ``parallel_stabilized``)."""
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, i, f = _fp32(q, k, v, i, f)
        t = q.shape[-2]
        cum = F.logsigmoid(f).cumsum(-1)
        log_d = cum.unsqueeze(-1) - cum.unsqueeze(-2) + i.unsqueeze(-2)  # (B, H, T_t, T_s)
        past = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        log_d = log_d.masked_fill(~past, float("-inf"))
        m = log_d.amax(dim=-1, keepdim=True)
        scores = (q @ (k / math.sqrt(k.shape[-1])).transpose(-1, -2)) * torch.exp(log_d - m)
        denom = torch.maximum(scores.sum(-1, keepdim=True).abs(), torch.exp(-m)) + EPS
        return (scores / denom) @ v
