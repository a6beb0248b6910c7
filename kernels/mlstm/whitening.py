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

``newton_schulz_fused(C, k)``: ``newton_schulz`` with the iterations fused into one autograd
node (a hand-written backward); equal up to rounding, what the chunkwise reads use.
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


class _NewtonSchulz(torch.autograd.Function):
    """``steps`` iterations ``X <- 1.5 X - 0.5 X (X^T X)`` with a hand-written backward.

    Autograd through ``(X X^T) X`` spends 2 + 4 batched matmuls and several elementwise
    passes per iteration; here the forward is 2 (``G = X^T X`` and one ``baddbmm``) and the
    backward 3: for ``Y = 1.5 X - 0.5 X G``, ``dX = 1.5 dY - 0.5 dY G - 0.5 X (M + M^T)`` with
    ``M = X^T dY`` (G symmetric). Saves every iterate and its Gram matrix.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, steps: int) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, *shape[-2:])
        saved = []
        for _ in range(steps):
            g = torch.bmm(x.transpose(1, 2), x)
            saved += [x, g]
            x = torch.baddbmm(x, x, g, beta=1.5, alpha=-0.5)
        ctx.save_for_backward(*saved)
        ctx.shape = shape
        return x.reshape(shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        saved = ctx.saved_tensors
        gy = grad.reshape(-1, *ctx.shape[-2:])
        for idx in range(len(saved) - 2, -1, -2):
            x, g = saved[idx], saved[idx + 1]
            m = torch.bmm(x.transpose(1, 2), gy)
            gx = torch.baddbmm(gy, gy, g, beta=1.5, alpha=-0.5)
            gy = torch.baddbmm(gx, x, m + m.transpose(1, 2), alpha=-0.5)
        return gy.reshape(ctx.shape), None


def newton_schulz_fused(c: torch.Tensor, steps: int) -> torch.Tensor:
    """:func:`newton_schulz` (Frobenius-normalise, ``steps`` iterations) with
    the iterations fused into one autograd node; equal up to rounding."""
    x = frobenius_normalize(c)
    return _NewtonSchulz.apply(x, steps) if steps > 0 else x
