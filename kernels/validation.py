"""Shape and device checks shared by the operators' public entry points."""

from __future__ import annotations

import torch


def expect_rank(name: str, x: torch.Tensor, rank: int, layout: str) -> None:
    """Raise ValueError unless ``x`` has ``rank`` dimensions (``layout`` names them)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a tensor {layout}, got {type(x).__name__}")
    if x.dim() != rank:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(x.shape)}")


def expect_shape(name: str, x: torch.Tensor | None, shape: tuple[int, ...], layout: str, device: torch.device) -> None:
    """Raise ValueError unless ``x`` (when given) has exactly ``shape`` and lives on ``device``."""
    if x is None:
        return
    expect_rank(name, x, len(shape), layout)
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must be {layout} = {tuple(shape)}, got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but the other inputs are on {device}")
