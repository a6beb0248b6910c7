"""The delta rule's chunkwise-parallel form (WY representation + UT transform)."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.chunking import DEFAULT_CHUNK_SIZE
from kernels.chunking import chunk_state_pass, factorable, from_chunks, segment_products, to_chunks, unit_lower_solve
from kernels.dispatch import check_chunk_size


def delta_rule_chunk(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, alpha: Tensor | None = None,
    *, initial_state: Tensor | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Chunkwise-parallel form (WY representation + UT transform), exact up to rounding.

    Within a chunk with entering state ``S0``, cumulative decay ``g_t = prod_{j<=t} alpha_j``
    and pairwise decay ``G[t, s] = prod_{s<j<=t} alpha_j``, write ``S_t = alpha_t S_{t-1} +
    u_t k_t^T`` with ``u_t = beta_t (v_t - alpha_t S_{t-1} k_t)``. Stacking the ``u_t`` as rows
    of ``U`` gives the unit lower-triangular system::

        (I + L) U = beta * V - (beta g) * K S0^T,    L[t, s] = beta_t G[t, s] k_t.k_s  (s < t)

    so ``U = Ut - W S0^T`` with ``Ut, W`` from one triangular solve that needs no state.
    Then ``O = A U + g * Q S0^T`` with ``A = tril(Q K^T * G)``, and the chunk maps ``S0``
    to ``g_C S0 + U^T Kd`` with ``Kd[s] = G[C, s] k_s``. Only ``U = Ut - W S0^T`` and that
    update run chunk after chunk (two small matmuls each); the rest is batched over chunks.

    ``G`` is applied as ``g_t / g_s`` carried by the vectors when the chunk's cumulative
    decays are safely representable (:func:`kernels.chunking.factorable`), else formed
    explicitly by segment products (``alpha`` at or near 0); both are exact up to rounding.
    """
    b, h, t_len, dk = q.shape
    dv = v.shape[-1]
    c = min(check_chunk_size(chunk_size), t_len)
    # Padding steps have k = v = beta = 0 and alpha = 1: identity steps that leave S unchanged.
    qc, kc, vc = to_chunks(q, c, 0.0), to_chunks(k, c, 0.0), to_chunks(v, c, 0.0)
    bc = to_chunks(beta, c, 0.0).unsqueeze(-1)  # (B, H, N, C, 1)
    if alpha is None:
        k_in = bc * kc
        lower, attn = _pair_matrices(k_in, qc, kc)
        read, k_decayed, chunk_decay = qc, kc, None
    else:
        ac = to_chunks(alpha, c, 1.0)
        g = torch.cumprod(ac, dim=-1).unsqueeze(-1)  # (B, H, N, C, 1)
        k_in = (bc * g) * kc  # beta_t g_t k_t
        read, chunk_decay = g * qc, g[..., -1:, :]  # g_C as (B, H, N, 1, 1)
        if factorable(g):
            # G[t, s] = g_t / g_s rides on the vectors: no C x C elementwise work.
            k_over_g = kc / g
            lower, attn = _pair_matrices(k_in, read, k_over_g)
            k_decayed = chunk_decay * k_over_g  # G[C, s] k_s
        else:
            pair = segment_products(ac, time_dim=-1)  # (B, H, N, C, C), zero above the diagonal
            lower, attn = _pair_matrices(bc * kc, qc, kc)
            lower, attn = lower * pair, attn * pair
            k_decayed = pair[..., -1, :].unsqueeze(-1) * kc
    rhs = torch.cat([bc * vc, k_in], dim=-1)
    u_tilde, w = unit_lower_solve(lower, rhs).split([dv, dk], dim=-1)
    state0 = q.new_zeros(b, h, dv, dk) if initial_state is None else initial_state
    # U = Ut - W S0^T, and S0 -> g_C S0 + U^T Kd, chunk after chunk.
    before, u, final = chunk_state_pass(state0, u_tilde, w, k_decayed, chunk_decay, sign=-1.0)
    out = attn @ u + read @ before.transpose(-1, -2)
    return from_chunks(out, t_len), final


def _pair_matrices(left_k: Tensor, left_q: Tensor, right: Tensor) -> tuple[Tensor, Tensor]:
    """``(left_k @ right^T, tril(left_q @ right^T))``, ``(..., C, C)`` each.

    The first is only read below its diagonal by the triangular solve, so it is not masked.
    (Two matmuls rather than one on concatenated rows: the concatenation and the slicing
    backward cost more memory traffic than the second call saves.)
    """
    right_t = right.transpose(-1, -2)
    return left_k @ right_t, (left_q @ right_t).tril()
