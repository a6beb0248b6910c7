"""Whitening of a memory matrix before it is read: Newton-Schulz iterations and the polar
factor (seed paper 003's ``ns<k>`` and ``polar`` reads).

Both act on the last two dimensions of ``(..., n, m)`` tensors, in the input's dtype (the
mLSTM calls them in float32 with autocast off).

``newton_schulz(C, k)``: ``X_0 = C / ||C||_F``, then ``k`` cubic iterations
``X <- 1.5 X - 0.5 X X^T X``. Frobenius normalisation puts every singular value in (0, 1],
inside the iteration's basin, and each step maps a singular value s to ``1.5 s - 0.5 s^3``,
which increases monotonically to 1: so ``ns<k>`` tends to the polar factor as k grows
(zero singular values stay zero). Gradients flow through every iteration.

``polar(C)``: ``W V^T`` from the SVD ``C = W diag(s) V^T``, keeping only directions with
``s > n * eps * max(s)`` (the limit of the iteration above). Its backward uses the closed
form of the polar factor's derivative, ``dU = W [((W^T dC V) - (W^T dC V)^T) / (s_i + s_j)] V^T``,
which is finite for repeated singular values (autograd through ``torch.linalg.svd`` is not).
"""

from __future__ import annotations

import torch

FROBENIUS_EPS = 1e-12


def frobenius_normalize(c: torch.Tensor) -> torch.Tensor:
    """``C / ||C||_F`` over the last two dimensions (zero stays zero)."""
    return c / (torch.linalg.matrix_norm(c, keepdim=True) + FROBENIUS_EPS)


def newton_schulz(c: torch.Tensor, steps: int) -> torch.Tensor:
    """Frobenius-normalise, then ``steps`` cubic Newton-Schulz iterations (``ns<steps>``)."""
    x = frobenius_normalize(c)
    for _ in range(steps):
        x = 1.5 * x - 0.5 * (x @ x.transpose(-1, -2)) @ x
    return x


class _Polar(torch.autograd.Function):
    @staticmethod
    def forward(ctx, c: torch.Tensor) -> torch.Tensor:
        w, s, vh = torch.linalg.svd(c, full_matrices=False)
        tol = s.amax(dim=-1, keepdim=True) * (max(c.shape[-2:]) * torch.finfo(c.dtype).eps)
        keep = s > tol
        u = (w * keep.unsqueeze(-2).to(w.dtype)) @ vh
        ctx.save_for_backward(w, s, vh, keep)
        return u

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # Unpacked once: a second ctx.saved_tensors fails under torch.utils.checkpoint.
        w, s, vh, keep = ctx.saved_tensors
        k = w.transpose(-1, -2) @ grad @ vh.transpose(-1, -2)
        denom = s.unsqueeze(-1) + s.unsqueeze(-2)
        pair = keep.unsqueeze(-1) | keep.unsqueeze(-2)
        coef = torch.where(pair, 1.0 / denom.clamp_min(torch.finfo(s.dtype).tiny), torch.zeros_like(denom))
        return w @ ((k - k.transpose(-1, -2)) * coef) @ vh


def polar(c: torch.Tensor) -> torch.Tensor:
    """Polar factor of each square matrix in ``c (..., n, n)`` (see module docstring)."""
    if c.shape[-1] != c.shape[-2]:
        raise ValueError(f"polar expects square matrices, got {tuple(c.shape[-2:])}")
    return _Polar.apply(c)
