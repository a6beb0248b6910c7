"""The diagonal-plus-low-rank (DPLR) scan: the RWKV-7 style transition.

Convention (seed paper 001, eqs. 3-4), per batch ``b`` and head ``h``::

    A_t = diag(w_t) - (a_t * kappa_t) kappa_t^T
    S_t = S_{t-1} A_t + v_t k_t^T,        o_t = S_t r_t

with state ``S_t`` of shape ``(Dv, Dk)`` (``S_0`` = initial state, zeros by default). The
transition acts on the key side (right), so ``diag(w_t)`` scales column ``i`` of the state
by ``w_t[i]``: decay and removal happen BEFORE the new write ``v_t k_t^T``, and ``o_t``
reads the state AFTER it. ``kappa`` is the removal key kappa-hat exactly as given:
normalising it, bounding ``w`` to (0, 1) and ``a`` to (0, 1) are the cell's job.
With ``a = 0`` this is a plain diagonal (vector-decay) scan, the ``dg_diag`` ablation.

Shapes: ``r, k, w, kappa, a (B, H, T, Dk)``, ``v (B, H, T, Dv)``,
``initial_state (B, H, Dv, Dk)``. Returns ``o (B, H, T, Dv)`` and the final state
``(B, H, Dv, Dk)``.
"""

from __future__ import annotations

from torch import Tensor

from kernels.chunking import DEFAULT_CHUNK_SIZE
from kernels.dispatch import check_chunk_size, is_transformed, resolve_impl, run_form
from kernels.dplr.chunk import dplr_scan_chunk
from kernels.dplr.reference import dplr_scan_naive
from kernels.validation import expect_shape, operator_dims

__all__ = ["DEFAULT_CHUNK_SIZE", "dplr_scan", "dplr_scan_chunk", "dplr_scan_naive"]

FORMS = (dplr_scan_naive, dplr_scan_chunk)


def dplr_scan(
    r: Tensor, k: Tensor, v: Tensor, w: Tensor, kappa: Tensor, a: Tensor,
    *, impl: str = "auto", initial_state: Tensor | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Run the DPLR scan; returns ``(o (B,H,T,Dv), final_state (B,H,Dv,Dk))``.

    ``S_t = S_{t-1} (diag(w_t) - (a_t * kappa_t) kappa_t^T) + v_t k_t^T``, ``o_t = S_t r_t``,
    inputs used as given. ``impl``: "naive", "chunk", "triton" or "auto" (triton on CUDA
    when it imports, else chunk). ``chunk_size`` only affects the chunk form. The PyTorch
    forms compute in fp32 for 16-bit inputs, return ``o`` in the input dtype and the final
    state in the compute dtype; fp64 stays fp64.
    """
    b, h, t_len, dk, dv, dev = operator_dims("r", r, "(B, H, T, Dk)", "v", v, "(B, H, T, Dv)")
    for name, x in (("k", k), ("w", w), ("kappa", kappa), ("a", a)):
        expect_shape(name, x, (b, h, t_len, dk), "(B, H, T, Dk)", dev)
    expect_shape("v", v, (b, h, t_len, dv), "(B, H, T, Dv)", dev)
    expect_shape("initial_state", initial_state, (b, h, dv, dk), "(B, H, Dv, Dk)", dev)
    check_chunk_size(chunk_size)
    form = resolve_impl("dplr_scan", impl, dev, transformed=is_transformed(r, k, v, w))
    return run_form("dplr_scan", form, FORMS, (r, k, v, w, kappa, a), initial_state, chunk_size, v, (b, h, dv, dk))
