"""Chunkwise (loop-free over positions) stabilised mLSTM memory states and whitened reads.

Same quantities as :mod:`kernels.mlstm.reference` (``C~_t, n~_t, m_t`` of the stabilised
recurrence, keys scaled by ``1/sqrt(D)``), computed a chunk of ``L`` positions at a time
instead of one position at a time. Inside a chunk starting after a carried state
``(C~_0, n~_0, m_0)``, with ``b_t`` the chunk-local cumulative log forget gate::

    m_t   = b_t + max(m_0, max_{s<=t} (i_s - b_s))           (= the loop's running max)
    C~_t  = exp(b_t + m_0 - m_t) C~_0 + sum_{s<=t} exp(b_t - b_s + i_s - m_t) v_s k_s^T

Every weight is ``<= 1`` by construction of ``m_t``, so nothing overflows whatever the gates
do; only chunk-local sums of log gates are formed (no long cumulative sums to lose
precision in). The chunk's states come from one batched contraction (``L^2 D^2`` per
chunk) and the only Python loop is over the ``T / L`` chunks.

:func:`chunked_read` fuses states, whitening and the read per chunk so that a chunk's
``(L, D, D)`` states and the whitening's intermediates exist only while that chunk is
processed; with ``checkpoint`` the backward recomputes them chunk by chunk
(``torch.utils.checkpoint``), so training memory is the carried ``(D, D)`` state per
chunk plus one chunk's working set instead of every position's states and every
Newton-Schulz iterate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as _checkpoint

from kernels.mlstm.reference import _fp32

DEFAULT_CHUNK = 16
# Checkpoint chunks once every position's states would exceed this many elements (256 MiB
# in float32 per states-sized tensor; Newton-Schulz keeps several per iteration).
CHECKPOINT_ELEMENTS = 1 << 26


def _chunk_states(
    c0: torch.Tensor | None,
    n0: torch.Tensor | None,
    m0: torch.Tensor | None,
    ks: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    logf: torch.Tensor,
    with_n: bool,
):
    """States of one chunk: ``C~ (B,H,L,Dv,Dk)``, ``n~ (B,H,L,Dk)`` or None, ``m (B,H,L)``.

    ``c0/n0/m0`` is the state carried in from the previous chunk (None for the first).
    """
    b = logf.cumsum(-1)
    run = (i - b).cummax(-1).values
    if m0 is None:
        m = b + run
    else:
        m = b + torch.maximum(m0.unsqueeze(-1), run)
    length = ks.shape[-2]
    past = torch.ones(length, length, dtype=torch.bool, device=ks.device).tril()
    log_w = (b - m).unsqueeze(-1) + (i - b).unsqueeze(-2)  # (B, H, L_t, L_s)
    w = torch.exp(log_w.masked_fill(~past, float("-inf")))
    # sum_s w_ts v_s k_s^T for every t: one (L_t, L_s) @ (L_s, Dv*Dk) matmul over the
    # flattened outer products (a broadcast matmul would materialise L copies of the keys).
    dv, dk = v.shape[-1], ks.shape[-1]
    outer = (v.unsqueeze(-1) * ks.unsqueeze(-2)).flatten(-2)  # (B, H, L, Dv*Dk)
    states = (w @ outer).unflatten(-1, (dv, dk))
    n = w @ ks if with_n else None
    if m0 is not None:
        assert c0 is not None  # the carried state comes whole: c0, n0 (with_n) and m0
        a = torch.exp(b + m0.unsqueeze(-1) - m)  # (B, H, L) <= 1
        states = states + a[..., None, None] * c0.unsqueeze(-3)
        if with_n:
            assert n is not None and n0 is not None
            n = n + a.unsqueeze(-1) * n0.unsqueeze(-2)
    return states, n, m


def _chunks(t_len: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(s + chunk, t_len)) for s in range(0, t_len, chunk)]


def memory_states_chunked(
    k: torch.Tensor, v: torch.Tensor, i: torch.Tensor, f: torch.Tensor, chunk: int = DEFAULT_CHUNK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(C~ (B,H,T,Dv,Dk), n~ (B,H,T,Dk), m (B,H,T))`` for every step, chunk by chunk.

    Equals :func:`kernels.mlstm.reference.memory_states` (and the loop's ``n~, m``) up to rounding.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    with torch.autocast(device_type=k.device.type, enabled=False):
        k, v, i, f = _fp32(k, v, i, f)
        ks = k / math.sqrt(k.shape[-1])
        logf = F.logsigmoid(f)
        cs, ns, ms = [], [], []
        c0 = n0 = m0 = None
        for s, e in _chunks(k.shape[-2], chunk):
            c, n, m = _chunk_states(c0, n0, m0, ks[:, :, s:e], v[:, :, s:e], i[:, :, s:e], logf[:, :, s:e], True)
            cs.append(c)
            ns.append(n)
            ms.append(m)
            c0, n0, m0 = c[:, :, -1], n[:, :, -1], m[:, :, -1]
        return torch.cat(cs, dim=2), torch.cat(ns, dim=2), torch.cat(ms, dim=2)


def _chunk_read(
    read: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    first: bool,
    c0: torch.Tensor,
    m0: torch.Tensor,
    ks: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    logf: torch.Tensor,
    q: torch.Tensor,
):
    states, _, m = _chunk_states(None if first else c0, None, None if first else m0, ks, v, i, logf, False)
    # Cloned: a view would keep this chunk's whole (L, Dv, Dk) states alive through the carry.
    return read(states, q), states[:, :, -1].clone(), m[:, :, -1].clone()


def chunked_read(
    read: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    chunk: int = DEFAULT_CHUNK,
    checkpoint: bool | None = None,
) -> torch.Tensor:
    """``read(C~_t, q_t)`` for every step, computed one chunk at a time: ``(B, H, T, Do)``.

    ``read(states (B,H,L,Dv,Dk), q (B,H,L,Dq)) -> (B,H,L,Do)`` must act position-wise (it is
    called once per chunk). ``checkpoint=None`` checkpoints each chunk when every position's
    states together would exceed ``CHECKPOINT_ELEMENTS`` elements, and only when a gradient
    is being recorded.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, i, f = _fp32(q, k, v, i, f)
        b_, h_, t_len, dk = k.shape
        if checkpoint is None:
            checkpoint = b_ * h_ * t_len * v.shape[-1] * dk > CHECKPOINT_ELEMENTS
        checkpoint = checkpoint and torch.is_grad_enabled()
        ks = k / math.sqrt(dk)
        logf = F.logsigmoid(f)
        # Placeholders for the first chunk's (absent) carry keep one signature for checkpoint.
        c0 = k.new_zeros(b_, h_, v.shape[-1], dk)
        m0 = k.new_zeros(b_, h_)
        outs = []
        for idx, (s, e) in enumerate(_chunks(t_len, chunk)):
            args = (read, idx == 0, c0, m0, ks[:, :, s:e], v[:, :, s:e], i[:, :, s:e], logf[:, :, s:e], q[:, :, s:e])
            if checkpoint:
                out, c0, m0 = _checkpoint(_chunk_read, *args, use_reentrant=False)
            else:
                out, c0, m0 = _chunk_read(*args)
            outs.append(out)
        return torch.cat(outs, dim=2)


def apply_read(mat: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``mat_t q_t`` for every position: ``(..., L, Do, Dk) x (..., L, Dk) -> (..., L, Do)``."""
    return (mat @ q.to(mat.dtype).unsqueeze(-1)).squeeze(-1)


class _SPDSolve(torch.autograd.Function):
    """``y = A^{-1} q`` for symmetric positive definite ``A (..., n, n)``, ``q (..., n, 1)``.

    Backward without differentiating the Cholesky factorisation (whose autograd dominated
    the rls read): ``dq = A^{-1} dy`` (A symmetric) and ``dA = -dq y^T``.
    """

    @staticmethod
    def forward(ctx, a: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        chol = torch.linalg.cholesky(a)
        y = torch.cholesky_solve(q, chol)
        ctx.save_for_backward(chol, y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        chol, y = ctx.saved_tensors
        gq = torch.cholesky_solve(grad, chol)
        return -gq @ y.transpose(-1, -2), gq


def rls_read_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    lam: float,
    *,
    chunk: int = DEFAULT_CHUNK,
    checkpoint: bool | None = None,
) -> torch.Tensor:
    """:func:`kernels.mlstm.reference.rls_read` (relative ridge) computed chunkwise.

    ``C~_t`` and the key Gram matrix ``K~_t`` share the memory's weights, so they are one
    chunked recurrence over the stacked values ``[v; k/sqrt(D)]``.
    """
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, i, f = _fp32(q, k, v, i, f)
        dv, dk = v.shape[-1], k.shape[-1]
        eye = lam * torch.eye(dk, device=k.device, dtype=k.dtype)

        def read(states: torch.Tensor, qc: torch.Tensor) -> torch.Tensor:
            c, gram = states[..., :dv, :], states[..., dv:, :] + eye
            return (c @ _SPDSolve.apply(gram, qc.unsqueeze(-1))).squeeze(-1)

        return chunked_read(
            read, q, k, torch.cat([v, k / math.sqrt(dk)], dim=-1), i, f, chunk=chunk, checkpoint=checkpoint
        )
