"""Recurrence operators behind one call each: a naive reference, a chunkwise PyTorch form,
and (where provided) Triton kernels.

Conventions, stated once for every operator here:

* Layout ``(B, H, T, D)``: batch, head, time, feature. Per-step scalars are ``(B, H, T)``.
* State orientation ``S in R^{Dv x Dk}`` per (batch, head): values index rows, keys index
  columns. Writes are outer products ``v k^T``; reads are ``o_t = S_t q_t`` (a column
  combination), taken from the state AFTER step ``t``'s update.
* ``ssd_scan`` follows the same orientation with its own names: ``H in R^{P x N}``,
  ``x ~ v`` (rows), ``b ~ k`` (columns), ``c ~ q`` (read): ``y_t = H_t c_t``.
* Decay enters BEFORE the write of the same step and, in the delta rule, before the delta
  correction: ``S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``. In the
  DPLR scan the transition multiplies from the right: ``S_t = S_{t-1} A_t + v_t k_t^T``.
* Operators apply the equations to their inputs exactly as given. L2-normalising ``q``/``k``
  or ``kappa``, scaling ``q``, squashing ``beta``/``alpha``/``w``/``a`` into (0, 1), short
  convolutions and output gates are the cell's job, never the operator's.
* Every operator returns ``(output, final_state)`` and accepts ``initial_state`` (``None`` =
  zeros), so a sequence can be processed in pieces with the state carried between them.
* ``impl``: ``"naive"`` (Python loop over time, the reference), ``"chunk"`` (chunkwise
  parallel, exact up to float rounding), ``"triton"`` (``kernels/<op>/triton.py``, when it
  imports) or ``"auto"`` (triton for CUDA tensors when available, chunk otherwise).
  ``IMPLS`` lists what each operator offers on this install.
* Chunk forms apply within-chunk decay products either as ratios of cumulative decays
  carried by the vectors (CPU, when no under/overflow is possible) or as explicit segment
  products (decays at or near 0, and always off the CPU, so no call syncs with a GPU).
  Both are exact up to rounding; the test suite checks both against the reference.
* Dtypes: fp64 and fp32 compute as given; 16-bit inputs compute in fp32 (autocast is
  switched off inside) and return the output in the input dtype and the state in fp32.

Operators, one package each: ``reference.py`` (the naive form), ``chunk.py`` (the chunk form),
``triton.py`` (the Triton form, where there is one) and the entry point in ``__init__.py``
(the forms' signatures are formatted by hand: the inputs on one line, the options on the next):
    ``delta_rule(q, k, v, beta, alpha=None)``   DeltaNet / Gated DeltaNet   ``kernels/delta_rule/``
    ``dplr_scan(r, k, v, w, kappa, a)``         RWKV-7 style diag + rank-1  ``kernels/dplr/``
    ``ssd_scan(x, a, b, c)``                    Mamba-2 SSD scalar decay    ``kernels/ssd/``
The mLSTM's stabilised memory and its reads (raw, whitened, least squares) are
``kernels/mlstm/`` (``kernels.mlstm.raw_read``, ``kernels.mlstm.whitened_read``; their own
conventions, see that package).

The package attribute ``kernels.delta_rule`` is the function; the package of the same name is
reached with ``from kernels.delta_rule import delta_rule_chunk`` (or ``sys.modules``).
Shared pieces: ``kernels.chunking`` (chunk machinery), ``kernels.loop`` (the naive forms'
loop), ``kernels.dispatch`` (``impl`` resolution and running a form), ``kernels.validation``
(shape checks), ``kernels.triton_scan`` (the Triton kernels both fused forms launch),
``kernels.triton_aot`` (compiling them for sm_61 without a GPU), ``kernels.testing``
(realistic inputs, reference comparisons); ``orchestrator bench kernels`` times the naive,
chunk and Triton forms side by side.
"""

from __future__ import annotations

from kernels.delta_rule import delta_rule, delta_rule_chunk, delta_rule_naive
from kernels.dispatch import OPS, available_impls, resolve_impl
from kernels.dplr import dplr_scan, dplr_scan_chunk, dplr_scan_naive
from kernels.ssd import ssd_scan, ssd_scan_chunk, ssd_scan_naive

__all__ = [
    "IMPLS",
    "OPS",
    "available_impls",
    "delta_rule",
    "delta_rule_chunk",
    "delta_rule_naive",
    "dplr_scan",
    "dplr_scan_chunk",
    "dplr_scan_naive",
    "resolve_impl",
    "ssd_scan",
    "ssd_scan_chunk",
    "ssd_scan_naive",
]


def __getattr__(name: str):
    # IMPLS is computed on access so that importing kernels never imports Triton.
    if name == "IMPLS":
        return {op: available_impls(op) for op in OPS}
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")
