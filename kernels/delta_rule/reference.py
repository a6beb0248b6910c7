"""The delta rule's naive form: one step of the recurrence per loop iteration (the reference)."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.loop import scan_loop


def delta_rule_naive(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, alpha: Tensor | None = None, *, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Reference: one step of the recurrence per loop iteration (see :mod:`kernels.delta_rule`)."""
    b, h, _, dk = q.shape
    dv = v.shape[-1]
    state = q.new_zeros(b, h, dv, dk) if initial_state is None else initial_state

    def update(state: torch.Tensor, t: int) -> torch.Tensor:
        k_t, v_t, b_t = k[:, :, t], v[:, :, t], beta[:, :, t, None, None]
        # S (I - beta k k^T) written as S - beta (S k) k^T: the same product, no Dk x Dk matrix.
        s_k = state @ k_t.unsqueeze(-1)
        kept = state - b_t * s_k * k_t.unsqueeze(-2)
        if alpha is not None:
            kept = alpha[:, :, t, None, None] * kept
        return kept + b_t * v_t.unsqueeze(-1) * k_t.unsqueeze(-2)

    return scan_loop(state, q, update)
