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

from torch import Tensor

from kernels.chunking import DEFAULT_CHUNK_SIZE
from kernels.delta_rule.chunk import delta_rule_chunk
from kernels.delta_rule.reference import delta_rule_naive
from kernels.dispatch import check_chunk_size, is_transformed, resolve_impl, run_form
from kernels.validation import expect_shape, operator_dims

__all__ = ["DEFAULT_CHUNK_SIZE", "delta_rule", "delta_rule_chunk", "delta_rule_naive"]

FORMS = (delta_rule_naive, delta_rule_chunk)


def delta_rule(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, alpha: Tensor | None = None,
    *, impl: str = "auto", initial_state: Tensor | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Run the (gated) delta rule; returns ``(o (B,H,T,Dv), final_state (B,H,Dv,Dk))``.

    ``S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t q_t``
    (``alpha=None`` means no decay). Inputs are used as given (normalisation and gating are
    the caller's). ``impl``: "naive", "chunk", "triton" or "auto" (triton on CUDA when it
    imports, else chunk). ``chunk_size`` only affects the chunk form. The PyTorch forms
    compute in fp32 for 16-bit inputs, return ``o`` in the input dtype and the final state
    in the compute dtype; fp64 stays fp64.
    """
    b, h, t_len, dk, dv, dev = operator_dims("q", q, "(B, H, T, Dk)", "v", v, "(B, H, T, Dv)")
    expect_shape("k", k, (b, h, t_len, dk), "(B, H, T, Dk)", dev)
    expect_shape("v", v, (b, h, t_len, dv), "(B, H, T, Dv)", dev)
    expect_shape("beta", beta, (b, h, t_len), "(B, H, T)", dev)
    expect_shape("alpha", alpha, (b, h, t_len), "(B, H, T)", dev)
    expect_shape("initial_state", initial_state, (b, h, dv, dk), "(B, H, Dv, Dk)", dev)
    check_chunk_size(chunk_size)
    form = resolve_impl("delta_rule", impl, dev, transformed=is_transformed(q, k, v, beta))
    return run_form("delta_rule", form, FORMS, (q, k, v, beta, alpha), initial_state, chunk_size, v, (b, h, dv, dk))
