"""The DPLR scan's naive form: one step of the recurrence per loop iteration (the reference)."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.loop import scan_loop


def dplr_scan_naive(
    r: Tensor, k: Tensor, v: Tensor, w: Tensor, kappa: Tensor, a: Tensor, *, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Reference: one step of the recurrence per loop iteration (see :mod:`kernels.dplr`)."""
    b, h, _, dk = r.shape
    dv = v.shape[-1]
    state = r.new_zeros(b, h, dv, dk) if initial_state is None else initial_state

    def update(state: torch.Tensor, t: int) -> torch.Tensor:
        kap = kappa[:, :, t]
        # S A_t = S diag(w_t) - (S (a_t * kappa_t)) kappa_t^T, without forming the Dk x Dk matrix.
        removed = state @ (a[:, :, t] * kap).unsqueeze(-1)
        state = state * w[:, :, t].unsqueeze(-2) - removed * kap.unsqueeze(-2)
        return state + v[:, :, t].unsqueeze(-1) * k[:, :, t].unsqueeze(-2)

    return scan_loop(state, r, update)
