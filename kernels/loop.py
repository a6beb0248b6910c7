"""The loop every naive reference runs: update the state, then read it, one step at a time."""

from __future__ import annotations

from collections.abc import Callable

import torch


def scan_loop(
    state: torch.Tensor, read: torch.Tensor, update: Callable[[torch.Tensor, int], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``S_t = update(S_{t-1}, t)``, then ``o_t = S_t read_t``, for every step ``t``.

    ``state`` is ``S_0`` ``(B, H, Dv, Dk)`` and ``read`` ``(B, H, T, Dk)``; returns
    ``(o (B, H, T, Dv), S_T)``: the output reads the state AFTER the step's update.
    """
    outs = []
    for t in range(read.shape[2]):
        state = update(state, t)
        outs.append((state @ read[:, :, t].unsqueeze(-1)).squeeze(-1))
    return torch.stack(outs, dim=2), state
