"""Softmax attention mixer (the control arm): causal or bidirectional, learned absolute
positions (added to the embedding by the harness) or rotary (applied to q and k here).

Per token: ``q, k, v = split(W_qkv x)`` (no bias; ``H`` heads of ``head_dim``), optional
arming conv on q, k, v, rotary on q and k, ``softmax(q k^T / sqrt(head_dim) + mask) v``,
then ``W_o`` back to ``d_model``. ``impl="auto"`` uses ``F.scaled_dot_product_attention``;
``impl="naive"`` spells the softmax out (the reference the tests compare against).

Attention keeps every key and value: its state grows with the sequence, ``2 * H * head_dim``
elements per token per layer (what ``state_elements`` reports, with ``state_scaling``
``"per_token"`` in ``cells.describe``).
"""

from __future__ import annotations

import math

from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from cells.conv import make_conv
from cells.delta import merge_heads, split_heads
from cells.family import Family, Knobs, MixerFactory, where

ROTARY_BASE = 10000.0


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotate pairs ``(x[..., i], x[..., i + D/2])`` of ``x (B, H, T, D)`` by angle
    ``t * base^(-2i/D)`` at position ``t`` (the GPT-NeoX / LLaMA convention)."""
    t, d = x.shape[-2], x.shape[-1]
    half = d // 2
    # Angles in at least float32 (bf16 positions would collide beyond t = 256).
    dtype = torch.promote_types(x.dtype, torch.float32)
    inv_freq = ROTARY_BASE ** (-torch.arange(half, device=x.device, dtype=dtype) * 2.0 / d)
    angles = torch.arange(t, device=x.device, dtype=dtype)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Reference softmax attention over ``(B, H, T, D)`` tensors."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[-2]
        future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(dim=-1) @ v


class AttentionMixer(nn.Module):
    """Multi-head softmax attention; ``bidirectional`` drops the causal mask."""

    def __init__(
        self, d_model: int, *, heads: int, head_dim: int, bidirectional: bool, positions: str, conv: int, impl: str
    ) -> None:
        super().__init__()
        if positions == "rotary" and head_dim % 2:
            raise ValueError(f"rotary positions need an even head_dim, got {head_dim}")
        self.heads, self.head_dim, self.positions, self.impl = heads, head_dim, positions, impl
        self.causal = not bidirectional
        inner = heads * head_dim
        self.qkv = nn.Linear(d_model, 3 * inner, bias=False)
        self.conv = make_conv(3 * inner, conv, bias=False)
        self.out = nn.Linear(inner, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        if self.conv is not None:
            qkv = self.conv(qkv)
        q, k, v = (split_heads(z, self.heads) for z in qkv.chunk(3, dim=-1))
        if self.positions == "rotary":
            q, k = rotary(q), rotary(k)
        if self.impl == "naive":
            o = attention_naive(q, k, v, self.causal)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(merge_heads(o))

    def state_elements(self) -> int:
        """KV-cache elements per token (attention has no fixed-size state)."""
        return 2 * self.heads * self.head_dim


def _head_dim(k: Knobs, d: int) -> int:
    return k["head_dim"] if k["head_dim"] is not None else d // k["heads"]


def _check(arm: str, k: Knobs, d: int) -> None:
    if k["head_dim"] is None and d % k["heads"]:
        raise ValueError(f"{where(arm, d)}: d_model must be divisible by heads ({k['heads']}) unless head_dim is set")
    head_dim = _head_dim(k, d)
    if k["positions"] == "rotary" and head_dim % 2:
        raise ValueError(f"{where(arm, d)}: rotary positions need an even head_dim, got {head_dim}")


def _mixer(k: Knobs, d: int) -> MixerFactory:
    return partial(
        AttentionMixer,
        d,
        heads=k["heads"],
        head_dim=_head_dim(k, d),
        bidirectional=k["bidirectional"],
        positions=k["positions"],
        conv=k["conv"],
        impl=k["impl"],
    )


FAMILY = Family(
    "attention",
    _mixer,
    _check,
    own_bidirectional=True,
    max_len=lambda k: k["max_len"] if k["positions"] == "learned" else None,
    state_scaling="per_token",
)
