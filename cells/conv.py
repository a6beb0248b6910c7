"""The short causal depthwise convolution (the "arming" knob).

Convention: input and output ``(B, T, C)``; weight ``(C, W)``; strictly causal with left
padding, so ``y[:, t, c] = bias[c] + sum_{i<W} weight[c, i] * x[:, t - (W - 1) + i, c]``
(``weight[:, W-1]`` multiplies the current step; steps before 0 are zeros). This is exactly
``F.conv1d`` with ``groups=C`` on a left-padded input, which :func:`causal_conv_reference`
computes; the module itself uses W shifted multiply-adds because on CPU their backward is
several times cheaper than ``Conv1d``'s (shared/MEASUREMENTS.md). Outside torch.func
transforms those multiply-adds run in one autograd node with a hand-written backward
(:class:`_ShiftedMultiplyAdd`): the same sums, in place on slices, with no padded copies,
no per-shift autograd nodes, and the taps as contiguous (W, C) rows (a strided weight column
broadcast over (B, T, C) was most of the old cost: ~4x slower per multiply-add on CPU).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ShortConv(nn.Module):
    """Depthwise causal convolution of width ``width`` over ``channels`` channels.

    Initialised like ``nn.Conv1d`` (uniform in ``±1/sqrt(width)``). Width 1 mixes no time
    steps: it is a per-channel scale (plus bias).
    """

    def __init__(self, channels: int, width: int, bias: bool) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"conv width must be >= 1, got {width}")
        self.channels, self.width = channels, width
        bound = 1.0 / math.sqrt(width)
        self.weight = nn.Parameter(torch.empty(channels, width).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(channels).uniform_(-bound, bound)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(x.dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if not _transformed(x, w):
            return _ShiftedMultiplyAdd.apply(x, w, bias)
        # Under vmap/grad transforms (seed packs) the composite form below has batching rules.
        taps = w.t().contiguous()  # (W, C): contiguous rows broadcast faster than strided columns
        y = x * taps[-1]
        for shift in range(1, min(self.width, x.shape[1] + 1)):
            # x shifted `shift` steps later in time, zeros entering at the start.
            y = y + F.pad(x[:, :-shift], (0, 0, shift, 0)) * taps[-1 - shift]
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y

    def extra_repr(self) -> str:
        return f"channels={self.channels}, width={self.width}, bias={self.bias is not None}"


def _transformed(*tensors: torch.Tensor) -> bool:
    return any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)


class _ShiftedMultiplyAdd(torch.autograd.Function):
    """``ShortConv``'s sum as one autograd node: ``y[:, t] = b + sum_s w[:, W-1-s] * x[:, t-s]``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # type: ignore[override]
        width, t_len = w.shape[1], x.shape[1]
        # Taps as contiguous rows: a column w[:, i] has stride W, and broadcasting a strided
        # vector over (B, T, C) is several times slower than a contiguous one on CPU.
        taps = w.t().contiguous()  # (W, C)
        y = x * taps[-1]
        for shift in range(1, min(width, t_len)):
            # Steps before 0 are zeros: shift s only adds into positions t >= s.
            y[:, shift:].addcmul_(x[:, :-shift], taps[-1 - shift])
        if bias is not None:
            y += bias
        ctx.save_for_backward(x, w)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, w = ctx.saved_tensors
        width, t_len = w.shape[1], x.shape[1]
        grad_x = grad_w = grad_b = None
        taps = w.t().contiguous()
        if ctx.needs_input_grad[0]:
            grad_x = grad * taps[-1]
            for shift in range(1, min(width, t_len)):
                grad_x[:, :-shift].addcmul_(grad[:, shift:], taps[-1 - shift])
        if ctx.needs_input_grad[1]:
            grad_taps = torch.zeros_like(taps)
            for shift in range(min(width, t_len)):
                grad_taps[-1 - shift] = (grad[:, shift:] * x[:, : t_len - shift]).sum((0, 1))
            grad_w = grad_taps.t()
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum((0, 1))
        return grad_x, grad_w, grad_b


def causal_conv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.conv1d`` form of :class:`ShortConv` (the reference the tests compare against)."""
    width = weight.shape[1]
    xt = F.pad(x.transpose(1, 2), (width - 1, 0))
    return F.conv1d(xt, weight.unsqueeze(1), bias, groups=weight.shape[0]).transpose(1, 2)


def make_conv(channels: int, width: int, bias: bool) -> ShortConv | None:
    """The arming conv, or None where it would be a no-op reparametrisation.

    A bias-free width-1 depthwise conv only rescales channels that a linear projection
    just produced, so it adds parameters without changing the function class; such a conv
    is omitted (``conv: 1`` on the delta/DPLR/attention/mLSTM arms means "unarmed").
    Convs with a bias (Mamba-2's) are kept at width 1, as the paper's toggle keeps them.
    """
    if width == 1 and not bias:
        return None
    return ShortConv(channels, width, bias)
