"""The mLSTM memory recurrence (xLSTM's, stabilised) and its reads.

Inputs per batch and head: ``q, k, v (B, H, T, D)``, input-gate and forget-gate
pre-activations ``i, f (B, H, T)``. Keys are scaled by ``1/sqrt(D)``. With
``F_t = sum_{j<=t} log sigmoid(f_j)``, the memory is a gated sum of outer products::

    C_t = sum_{s<=t} exp(F_t - F_s + i_s) v_s k_s^T     (exponential input gate)
    n_t = sum_{s<=t} exp(F_t - F_s + i_s) k_s           (normaliser)
    m_t = max_{s<=t} (F_t - F_s + i_s)                   (stabiliser)

Everything is stored scaled by ``exp(-m_t)`` (``C~, n~``), which is what keeps the
exponential gate finite. The raw (stock mLSTM) read is

    h_t = C~_t q_t / (max(|n~_t . q_t|, exp(-m_t)) + eps),

and a whitened read is ``W(C~_t) q_t`` (Newton-Schulz, the polar factor, or least squares).

Forms, side by side: ``reference.py`` (one position per loop iteration, the references),
``parallel.py`` (the raw read's quadratic form), ``chunk.py`` (chunkwise states and whitened
reads) and ``whitening.py`` (the matrix functions). :func:`raw_read` and
:func:`whitened_read` pick the form from ``impl`` as the cell's knob does: ``"naive"`` the
loop, anything else the loop-free form. All compute in float32 with autocast off and return
float32 (float64 for float64 inputs).
"""

from __future__ import annotations

from functools import partial

import torch

from kernels.mlstm.chunk import apply_read, chunked_read, memory_states_chunked, rls_read_chunked
from kernels.mlstm.parallel import raw_read_parallel
from kernels.mlstm.reference import memory_states, raw_read_loop, rls_read, rls_read_recursive
from kernels.mlstm.whitening import newton_schulz, newton_schulz_fused, polar

__all__ = [
    "apply_read",
    "chunked_read",
    "memory_states",
    "memory_states_chunked",
    "newton_schulz",
    "newton_schulz_fused",
    "polar",
    "raw_read",
    "raw_read_loop",
    "raw_read_parallel",
    "rls_read",
    "rls_read_chunked",
    "rls_read_recursive",
    "whitened_read",
]


def raw_read(q, k, v, i, f, *, impl: str = "auto") -> torch.Tensor:
    """The stock mLSTM read: the loop for ``impl="naive"``, else the parallel form."""
    if impl == "naive":
        return raw_read_loop(q, k, v, i, f)
    return raw_read_parallel(q, k, v, i, f)


def whitened_read(
    q, k, v, i, f, *, whiten: str, steps: int = 0, lam: float = 1.0, rls_form: str = "relative", impl: str = "auto"
) -> torch.Tensor:
    """A whitened read ``W(C~_t) q_t`` for every position: ``(B, H, T, D)``.

    ``whiten``: ``"ns"`` (Frobenius-normalise, then ``steps`` Newton-Schulz iterations),
    ``"polar"`` (the exact polar factor) or ``"rls"`` (least squares with ridge ``lam``;
    ``rls_form`` "relative" or "recursive", see :mod:`kernels.mlstm.reference`).
    ``impl="naive"`` reads position by position (the reference); every other impl reads
    chunkwise, which equals it up to rounding (the recursive rls read is a loop either way).
    """
    naive = impl == "naive"
    if whiten == "rls":
        if rls_form == "relative":
            return rls_read(q, k, v, i, f, lam) if naive else rls_read_chunked(q, k, v, i, f, lam)
        return rls_read_recursive(q, k, v, i, f, lam)
    if whiten == "polar":
        fn = polar
    else:
        fn = partial(newton_schulz if naive else newton_schulz_fused, steps=steps)
    if not naive:
        return chunked_read(lambda states, qc: apply_read(fn(states), qc), q, k, v, i, f)
    with torch.autocast(device_type=q.device.type, enabled=False):
        states = memory_states(k, v, i, f)  # (B, H, T, D, D)
        return apply_read(fn(states), q)
