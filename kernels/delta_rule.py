"""The (gated) delta rule: DeltaNet and Gated DeltaNet recurrences.

Convention (seed paper 001, eqs. 1-2), per batch ``b`` and head ``h``::

    S_t = alpha_t * S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,    o_t = S_t q_t

with state ``S_t`` of shape ``(Dv, Dk)`` and ``S_0`` the initial state (zeros by default).
The decay ``alpha_t`` multiplies the old state BEFORE the delta correction, exactly as
written; ``alpha=None`` means ``alpha_t = 1`` (plain DeltaNet). ``o_t`` reads the state
AFTER step ``t``'s write. The operator applies the equation to its inputs as given:
L2-normalising ``k``/``q``, scaling ``q``, and squashing ``beta``/``alpha`` into (0, 1) are
the cell's job.

Shapes: ``q, k (B, H, T, Dk)``, ``v (B, H, T, Dv)``, ``beta, alpha (B, H, T)``,
``initial_state (B, H, Dv, Dk)``. Returns ``o (B, H, T, Dv)`` and the final state
``(B, H, Dv, Dk)``.
"""

from __future__ import annotations

import torch

from kernels.chunking import (
    chunk_state_pass,
    factorable,
    from_chunks,
    segment_products,
    to_chunks,
    unit_lower_solve,
)
from kernels.dispatch import (
    check_chunk_size,
    empty_result,
    is_transformed,
    resolve_impl,
    run_pytorch_form,
    triton_function,
)
from kernels.validation import expect_rank, expect_shape

# Measured on 2-core CPUs (T = 64..512, D = 16..64, fwd+bwd): 16 ties 32 at batch 8 and is
# ~25% faster at batch 64, where the (C, C) intermediates' memory traffic dominates.
DEFAULT_CHUNK_SIZE = 16


def delta_rule_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    alpha: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: one step of the recurrence per loop iteration (see module docstring)."""
    b, h, t_len, dk = q.shape
    dv = v.shape[-1]
    state = q.new_zeros(b, h, dv, dk) if initial_state is None else initial_state
    outs = []
    for t in range(t_len):
        k_t, v_t, b_t = k[:, :, t], v[:, :, t], beta[:, :, t, None, None]
        # S (I - beta k k^T) written as S - beta (S k) k^T: the same product, no Dk x Dk matrix.
        s_k = state @ k_t.unsqueeze(-1)
        kept = state - b_t * s_k * k_t.unsqueeze(-2)
        if alpha is not None:
            kept = alpha[:, :, t, None, None] * kept
        state = kept + b_t * v_t.unsqueeze(-1) * k_t.unsqueeze(-2)
        outs.append((state @ q[:, :, t].unsqueeze(-1)).squeeze(-1))
    return torch.stack(outs, dim=2), state


def delta_rule_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    alpha: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
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


def _pair_matrices(
    left_k: torch.Tensor, left_q: torch.Tensor, right: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(left_k @ right^T, tril(left_q @ right^T))``, ``(..., C, C)`` each.

    The first is only read below its diagonal by the triangular solve, so it is not masked.
    (Two matmuls rather than one on concatenated rows: the concatenation and the slicing
    backward cost more memory traffic than the second call saves.)
    """
    right_t = right.transpose(-1, -2)
    return left_k @ right_t, (left_q @ right_t).tril()


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    alpha: torch.Tensor | None = None,
    *,
    impl: str = "auto",
    initial_state: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the (gated) delta rule; returns ``(o (B,H,T,Dv), final_state (B,H,Dv,Dk))``.

    ``S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t q_t``
    (``alpha=None`` means no decay). Inputs are used as given (normalisation and gating are
    the caller's). ``impl``: "naive", "chunk", "triton" or "auto" (triton on CUDA when it
    imports, else chunk). ``chunk_size`` only affects the chunk form. The PyTorch forms
    compute in fp32 for 16-bit inputs, return ``o`` in the input dtype and the final state
    in the compute dtype; fp64 stays fp64.
    """
    expect_rank("q", q, 4, "(B, H, T, Dk)")
    b, h, t_len, dk = q.shape
    expect_rank("v", v, 4, "(B, H, T, Dv)")
    dv = v.shape[-1]
    dev = q.device
    expect_shape("k", k, (b, h, t_len, dk), "(B, H, T, Dk)", dev)
    expect_shape("v", v, (b, h, t_len, dv), "(B, H, T, Dv)", dev)
    expect_shape("beta", beta, (b, h, t_len), "(B, H, T)", dev)
    expect_shape("alpha", alpha, (b, h, t_len), "(B, H, T)", dev)
    expect_shape("initial_state", initial_state, (b, h, dv, dk), "(B, H, Dv, Dk)", dev)
    check_chunk_size(chunk_size)
    form = resolve_impl("delta_rule", impl, dev, transformed=is_transformed(q, k, v, beta))
    if form == "triton":
        fn, _ = triton_function("delta_rule")
        return fn(q, k, v, beta, alpha, initial_state)
    if t_len == 0:
        return empty_result(v, (b, h, 0, dv), (b, h, dv, dk), initial_state)
    if form == "naive":
        return run_pytorch_form(delta_rule_naive, (q, k, v, beta, alpha), initial_state)
    return run_pytorch_form(delta_rule_chunk, (q, k, v, beta, alpha), initial_state, chunk_size=chunk_size)
