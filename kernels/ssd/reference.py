"""The SSD scan's naive form: one step of the recurrence per loop iteration (the reference)."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.loop import scan_loop


def ssd_scan_naive(
    x: Tensor, a: Tensor, b: Tensor, c: Tensor, *, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Reference: one step of the recurrence per loop iteration (see :mod:`kernels.ssd`)."""
    bsz, h, _, p = x.shape
    n = b.shape[-1]
    state = x.new_zeros(bsz, h, p, n) if initial_state is None else initial_state

    def update(state: torch.Tensor, t: int) -> torch.Tensor:
        return a[:, :, t, None, None] * state + x[:, :, t].unsqueeze(-1) * b[:, :, t].unsqueeze(-2)

    return scan_loop(state, c, update)
