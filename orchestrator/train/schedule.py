"""Learning-rate schedules, as a multiplier of the base LR for optimizer update ``step``
(1-based: the first update is step 1)."""

from __future__ import annotations

import math


def lr_multiplier(
    step: int,
    *,
    schedule: str,
    steps: int,
    warmup_steps: int = 0,
    cosine_steps: int | None = None,
    min_lr_ratio: float = 0.0,
) -> float:
    """Linear warmup over ``warmup_steps``, then constant or cosine decay to ``min_lr_ratio``
    over the period ``cosine_steps`` (default: the budget). Past the period the LR stays at
    its floor: a period longer than the budget (the scaffold study's T = 4,000 at a 2,000-step
    budget) simply stops partway down."""
    if warmup_steps > 0 and step <= warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        period = (cosine_steps or steps) - warmup_steps
        progress = min(max(step - warmup_steps, 0) / max(period, 1), 1.0)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}")
