"""The Mamba-2 SSD recurrence: a per-head scalar selective diagonal scan.

Convention (seed paper 001, eq. 5), per batch ``b`` and head ``h``::

    H_t = a_t H_{t-1} + x_t b_t^T,        y_t = H_t c_t

with explicit state ``H_t`` of shape ``(P, N)`` (``P`` channels of the head, ``N`` =
d_state; ``H_0`` = initial state, zeros by default). The decay ``a_t`` is applied before
the write and ``y_t`` reads the state after it. The operator takes ``a`` as the decay
itself (Mamba-2's ``exp(dt * A)``), ``x`` already scaled by ``dt`` if the cell wants that,
and adds no ``D`` skip term: those are the cell's job.

Shapes: ``x (B, H, T, P)``, ``a (B, H, T)``, ``b, c (B, H, T, N)``,
``initial_state (B, H, P, N)``. Returns ``y (B, H, T, P)`` and the final state ``(B, H, P, N)``.
"""

from __future__ import annotations

from torch import Tensor

from kernels.dispatch import check_chunk_size, resolve_impl, run_form
from kernels.ssd.chunk import DEFAULT_CHUNK_SIZE, ssd_scan_chunk
from kernels.ssd.reference import ssd_scan_naive
from kernels.validation import expect_shape, operator_dims

__all__ = ["DEFAULT_CHUNK_SIZE", "ssd_scan", "ssd_scan_chunk", "ssd_scan_naive"]

FORMS = (ssd_scan_naive, ssd_scan_chunk)


def ssd_scan(
    x: Tensor, a: Tensor, b: Tensor, c: Tensor,
    *, impl: str = "auto", initial_state: Tensor | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Run the SSD scan; returns ``(y (B,H,T,P), final_state (B,H,P,N))``.

    ``H_t = a_t H_{t-1} + x_t b_t^T``, ``y_t = H_t c_t``, inputs used as given. ``impl``:
    "naive", "chunk" or "auto" (always chunk: there is no triton form). The PyTorch forms
    compute in fp32 for 16-bit inputs, return ``y`` in the input dtype and the final state
    in the compute dtype; fp64 stays fp64.
    """
    bsz, h, t_len, p, n, dev = operator_dims("x", x, "(B, H, T, P)", "b", b, "(B, H, T, N)")
    expect_shape("a", a, (bsz, h, t_len), "(B, H, T)", dev)
    expect_shape("b", b, (bsz, h, t_len, n), "(B, H, T, N)", dev)
    expect_shape("c", c, (bsz, h, t_len, n), "(B, H, T, N)", dev)
    expect_shape("initial_state", initial_state, (bsz, h, p, n), "(B, H, P, N)", dev)
    check_chunk_size(chunk_size)
    form = resolve_impl("ssd_scan", impl, dev)
    return run_form("ssd_scan", form, FORMS, (x, a, b, c), initial_state, chunk_size, x, (bsz, h, p, n))
