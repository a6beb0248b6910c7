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


def operator_dims(
    first: str, x: torch.Tensor, x_layout: str, second: str, y: torch.Tensor, y_layout: str
) -> tuple[int, int, int, int, int, torch.device]:
    """Check that the inputs named ``first`` and ``second`` are ``(B, H, T, D)`` tensors; return
    ``(B, H, T, D of x, D of y, device)`` read from them (the other inputs are checked against it)."""
    expect_rank(first, x, 4, x_layout)
    expect_rank(second, y, 4, y_layout)
    b, h, t_len, dx = x.shape
    return b, h, t_len, dx, y.shape[-1], x.device
