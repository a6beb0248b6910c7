"""The one-block mLSTM of the scaffold study (seed paper 003), with its read variants.

Layer (xLSTM's mLSTM layer; x pre-normed by the harness, ``I = ceil(proj_factor*d/64)*64``
inner width as xLSTM rounds it, ``H`` heads of ``D = I/H``)::

    x_m, z = split(W_up x)                              no bias
    x_c    = silu(conv(x_m))                            causal depthwise conv, with bias
    q, k   = headwise(x_c);  v = headwise(x_m)          block-diagonal, blocks of qkv_blocksize
    i, f   = W_i [q;k;v] + b_i,  W_f [q;k;v] + b_f      per head (exp input, sigmoid forget)
    h      = read(C_t, n_t, m_t; q_t)                   see kernels.mlstm
    h      = GroupNorm_per_head(h) + skip * x_c
    y      = W_down (h * silu(z))                       no bias

Init as xLSTM: W_up, q/k/v ~ N(0, 2/(5d)), W_down ~ N(0, (2/sqrt(d))^2), gate weights 0,
forget bias linspace(3, 6), input bias N(0, 0.1^2), skip 1. At d = 94, 4 heads, factor 2,
conv 4, vocab 80 the whole model has 77,716 parameters (the paper's "about 78K").

Read variants (knob ``read``): ``raw`` (stock); ``ns<k>`` (Frobenius-normalise C~_t, then k
Newton-Schulz iterations, gradients through them); ``polar`` (exact polar factor); ``rls``
(least squares, ridge ``rls_lambda``; ``rls_form`` "relative": ridge relative to the
strongest write, solved per step, or "recursive": Sherman-Morrison with a decaying prior,
see kernels.mlstm); ``st_forward`` (value of the ns<st_steps> read,
gradient of the raw read) and ``st_backward`` (value raw, gradient whitened). A whitened
read is ``W(C~_t) q_t``: scale-free, so the normaliser is not applied. The output is the
blend ``alpha * whitened + (1 - alpha) * raw`` with ``alpha = read_blend`` (1 by default),
settable every step with ``set_read_blend`` for anneals.

The recurrence and its reads are ``kernels.mlstm``: ``impl="naive"`` computes every read with
a loop over positions (the reference); any other impl uses the parallel raw read and the
chunkwise whitened reads (``rls_form="recursive"`` stays a loop: its Sherman-Morrison
recursion is sequential).

Other knobs: ``write="delta"`` replaces the additive write by erase-before-write,
``S_t = f_t S_{t-1}(I - beta_t k^_t k^_t^T) + beta_t v_t k^_t^T`` with ``f = sigmoid(f~)``,
``beta = sigmoid(i~)``, ``k^ = k/|k|`` (``kernels.delta_rule``; bounded gates because the
delta rule needs beta in (0, 1]; read raw ``S_t q_t``). ``frozen_keys`` replaces the key
projection by a fixed random orthogonal matrix per head (a buffer, not trained).
``read_lr_mult`` multiplies the learning rate of the read path (q and k projections) via
the harness's ``param_groups``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from cells.conv import make_conv
from cells.delta import merge_heads, split_heads
from cells.family import Family, Knobs, knob_mixer, where
from cells.knobs import read_ns_steps
from kernels.mlstm import raw_read, whitened_read

ROUND_INNER_TO = 64


def inner_width(d_model: int, proj_factor: float) -> int:
    """xLSTM's up-projection width: ``proj_factor * d_model`` rounded up to a multiple of 64."""
    return int(math.ceil(proj_factor * d_model / ROUND_INNER_TO) * ROUND_INNER_TO)


class HeadwiseLinear(nn.Module):
    """Block-diagonal linear map on ``(..., I)``: ``I / block`` independent ``block x block`` maps."""

    def __init__(self, width: int, block: int, std: float) -> None:
        super().__init__()
        self.blocks, self.block = width // block, block
        self.weight = nn.Parameter(torch.randn(self.blocks, block, block) * std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = x.reshape(*x.shape[:-1], self.blocks, self.block)
        return torch.einsum("...ni,noi->...no", xs, self.weight.to(xs.dtype)).reshape(x.shape)


def random_orthogonal(heads: int, dim: int) -> torch.Tensor:
    """``heads`` Haar-random orthogonal ``dim x dim`` matrices (QR with sign correction)."""
    q, r = torch.linalg.qr(torch.randn(heads, dim, dim))
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)


class MLSTMMixer(nn.Module):
    """xLSTM's mLSTM layer with the scaffold study's read and write variants."""

    causal = True
    frozen_k: torch.Tensor | None  # a buffer with frozen_keys (then k_proj is None), else None

    def __init__(
        self,
        d_model: int,
        *,
        heads: int,
        proj_factor: float,
        conv: int,
        read: str,
        read_blend: float,
        rls_lambda: float,
        rls_form: str,
        st_steps: int,
        write: str,
        frozen_keys: bool,
        read_lr_mult: float,
        qkv_blocksize: int,
        impl: str,
    ) -> None:
        super().__init__()
        inner = inner_width(d_model, proj_factor)
        if inner % heads:
            raise ValueError(f"mLSTM inner width {inner} is not divisible by heads {heads}")
        if inner % qkv_blocksize:
            raise ValueError(f"mLSTM inner width {inner} is not divisible by qkv_blocksize {qkv_blocksize}")
        self.inner, self.heads, self.head_dim = inner, heads, inner // heads
        self.read, self.write, self.impl = read, write, impl
        self.read_blend = float(read_blend)
        self.rls_lambda, self.rls_form = rls_lambda, rls_form
        self.st_steps, self.read_lr_mult = st_steps, read_lr_mult
        std = math.sqrt(2.0 / (5.0 * d_model))
        self.proj_up = nn.Linear(d_model, 2 * inner, bias=False)
        nn.init.normal_(self.proj_up.weight, std=std)
        self.conv = make_conv(inner, conv, bias=True)
        self.q_proj = HeadwiseLinear(inner, qkv_blocksize, std)
        if frozen_keys:
            self.k_proj = None
            self.register_buffer("frozen_k", random_orthogonal(heads, self.head_dim))
        else:
            self.k_proj = HeadwiseLinear(inner, qkv_blocksize, std)
            self.frozen_k = None
        self.v_proj = HeadwiseLinear(inner, qkv_blocksize, std)
        self.igate = nn.Linear(3 * inner, heads)
        self.fgate = nn.Linear(3 * inner, heads)
        nn.init.zeros_(self.igate.weight)
        nn.init.normal_(self.igate.bias, std=0.1)
        nn.init.zeros_(self.fgate.weight)
        with torch.no_grad():
            self.fgate.bias.copy_(torch.linspace(3.0, 6.0, heads))
        self.outnorm_weight = nn.Parameter(torch.ones(inner))
        self.skip = nn.Parameter(torch.ones(inner))
        self.proj_down = nn.Linear(inner, d_model, bias=False)
        nn.init.normal_(self.proj_down.weight, std=2.0 / math.sqrt(d_model))

    # ---- hooks ------------------------------------------------------------------------
    def set_read_blend(self, alpha: float) -> None:
        if self.read == "raw":
            raise ValueError("the raw read has nothing to blend (choose a whitened read)")
        self.read_blend = float(alpha)

    def read_path_parameters(self) -> tuple[list[nn.Parameter], float]:
        """The q and k projections (the read path of seed paper 003) and their LR multiplier."""
        params = list(self.q_proj.parameters())
        if self.k_proj is not None:
            params += list(self.k_proj.parameters())
        return params, self.read_lr_mult

    def state_elements(self) -> int:
        """C (H*D*D), plus n (H*D) and m (H) for the additive write, plus P (H*D*D) for rls."""
        h, d = self.heads, self.head_dim
        if self.write == "delta":
            return h * d * d
        total = h * d * d + h * d + h
        if self.read == "rls":
            total += h * d * d  # the key Gram matrix (or its inverse P in the recursive form)
        return total

    # ---- forward ----------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_m, z = self.proj_up(x).chunk(2, dim=-1)
        x_c = F.silu(self.conv(x_m)) if self.conv is not None else F.silu(x_m)
        q = self.q_proj(x_c)
        if self.k_proj is not None:
            k = self.k_proj(x_c)
        else:
            assert self.frozen_k is not None
            xh = x_c.reshape(*x_c.shape[:-1], self.heads, self.head_dim)
            k = torch.einsum("...hi,hoi->...ho", xh, self.frozen_k.to(xh.dtype)).reshape(x_c.shape)
        v = self.v_proj(x_m)
        gate_in = torch.cat([q, k, v], dim=-1)
        i_pre = self.igate(gate_in).transpose(1, 2)  # (B, H, T)
        f_pre = self.fgate(gate_in).transpose(1, 2)
        qh, kh, vh = (split_heads(t, self.heads) for t in (q, k, v))
        h = self._cell(qh, kh, vh, i_pre, f_pre)  # (B, H, T, D) float32
        h = F.layer_norm(h, (self.head_dim,), eps=1e-5)
        h = merge_heads(h) * self.outnorm_weight
        h = h + self.skip * x_c
        return self.proj_down((h * F.silu(z)).to(x_m.dtype))

    def _raw(self, q, k, v, i, f) -> torch.Tensor:
        return raw_read(q, k, v, i, f, impl=self.impl)

    def _whitened(self, q, k, v, i, f) -> torch.Tensor:
        if self.read in ("rls", "polar"):
            whiten, steps = self.read, 0
        else:  # ns<k>, or the straight-through reads' ns<st_steps>
            ns = read_ns_steps(self.read)
            whiten, steps = "ns", ns if ns is not None else self.st_steps
        return whitened_read(
            q, k, v, i, f, whiten=whiten, steps=steps, lam=self.rls_lambda, rls_form=self.rls_form, impl=self.impl
        )

    def _cell(self, q, k, v, i, f) -> torch.Tensor:
        if self.write == "delta":
            o, _ = kernels.delta_rule(q, F.normalize(k, dim=-1), v, torch.sigmoid(i), torch.sigmoid(f), impl=self.impl)
            return o if o.dtype == torch.float64 else o.float()
        if self.read == "raw":
            return self._raw(q, k, v, i, f)
        alpha = self.read_blend
        if self.read in ("st_forward", "st_backward"):
            raw, white = self._raw(q, k, v, i, f), self._whitened(q, k, v, i, f)
            if self.read == "st_forward":
                read = raw + (white - raw).detach()
            else:
                read = white + (raw - white).detach()
            return read if alpha == 1.0 else alpha * read + (1.0 - alpha) * raw
        if alpha == 1.0:
            return self._whitened(q, k, v, i, f)
        if alpha == 0.0:
            return self._raw(q, k, v, i, f)
        return alpha * self._whitened(q, k, v, i, f) + (1.0 - alpha) * self._raw(q, k, v, i, f)


def _check(arm: str, k: Knobs, d: int) -> None:
    inner = inner_width(d, k["proj_factor"])
    if inner % k["heads"]:
        raise ValueError(f"{where(arm, d)}: inner width {inner} must be divisible by heads ({k['heads']})")
    if inner % k["qkv_blocksize"]:
        raise ValueError(
            f"{where(arm, d)}: inner width {inner} must be divisible by qkv_blocksize ({k['qkv_blocksize']})"
        )
    if k["write"] == "delta" and k["read"] != "raw":
        raise ValueError(f"arm {arm!r}: write 'delta' supports only read 'raw', got {k['read']!r}")
    if k["impl"] in ("chunk", "triton") and k["write"] != "delta":
        raise ValueError(
            f"arm {arm!r}: impl {k['impl']!r} applies to write 'delta' only (the additive write has auto or naive)"
        )


_KNOBS = (
    "heads",
    "proj_factor",
    "conv",
    "read",
    "read_blend",
    "rls_lambda",
    "rls_form",
    "st_steps",
    "write",
    "frozen_keys",
    "read_lr_mult",
    "qkv_blocksize",
    "impl",
)
FAMILY = Family(
    "mlstm", knob_mixer(MLSTMMixer, *_KNOBS), _check, blendable=lambda k: k["read"] != "raw" and k["write"] == "add"
)
