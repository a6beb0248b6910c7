"""The DPLR scan's Triton form: fused forward and backward kernels (CUDA, or Triton's interpreter).

The kernels are :mod:`kernels.triton_scan`'s, shared with the delta rule's Triton form.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.triton_scan import Scan, cast_grad, check_device, check_shapes, dtypes_of, state_dtype, to_f32


class DplrScanTriton(torch.autograd.Function):
    """``S_t = S_{t-1}(diag(w_t) - (a_t*kappa_t) kappa_t^T) + v_t k_t^T``, ``o_t = S_t r_t``."""

    @staticmethod
    def forward(ctx, r, k, v, w, kappa, a, initial_state, block_v=None, chunk=None):
        check_device(r)
        xs = [to_f32(x) for x in (r, k, v, w, kappa, a)]
        s0 = to_f32(initial_state)
        scan = Scan(xs[0], xs[2], delta=False, has_alpha=False, block_v=block_v, chunk=chunk)
        o, sT = scan.forward(xs, s0)
        ctx.save_for_backward(*xs, s0)
        ctx.scan = scan
        ctx.dtypes = dtypes_of(r, k, v, w, kappa, a, initial_state)
        out_dtype = torch.promote_types(r.dtype, v.dtype)
        return o.to(out_dtype), sT.to(state_dtype(out_dtype))

    @staticmethod
    def backward(ctx, do, dsT):
        *xs, s0 = ctx.saved_tensors
        dr, dk, dv, dw, dkappa, da, ds0 = ctx.scan.backward(list(xs), s0, to_f32(do), to_f32(dsT))
        grads = (dr, dk, dv, dw, dkappa, da, ds0)
        return tuple(cast_grad(g, x, n) for g, x, n in zip(grads, ctx.dtypes, ctx.needs_input_grad)) + (None, None)


def dplr_scan_triton(
    r: Tensor, k: Tensor, v: Tensor, w: Tensor, kappa: Tensor, a: Tensor, initial_state: Tensor | None = None,
    *, block_v: int | None = None, chunk: int | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """DPLR scan with Triton forward and backward; returns ``(o, final_state)``.

    r, k, w, kappa, a: (B, H, T, Dk); v: (B, H, T, Dv); initial_state: (B, H, Dv, Dk) or
    None. ``kappa`` enters as given (normalise it before calling). Knobs as in
    :func:`delta_rule_triton`.
    """
    check_shapes(("r", "k", "v", "w", "kappa", "a"), (r, k, v, w, kappa, a), (), initial_state)
    return DplrScanTriton.apply(r, k, v, w, kappa, a, initial_state, block_v, chunk)
