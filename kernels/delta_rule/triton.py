"""The delta rule's Triton form: fused forward and backward kernels (CUDA, or Triton's interpreter).

The kernels are :mod:`kernels.triton_scan`'s, shared with the DPLR scan's Triton form.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.triton_scan import Scan, cast_grad, check_device, check_shapes, dtypes_of, state_dtype, to_f32


class DeltaRuleTriton(torch.autograd.Function):
    """``S_t = a_t S_{t-1}(I - b_t k_t k_t^T) + b_t v_t k_t^T``, ``o_t = S_t q_t`` (see module doc)."""

    @staticmethod
    def forward(ctx, q, k, v, beta, alpha, initial_state, block_v=None, chunk=None):
        check_device(q)
        beta32 = to_f32(beta)
        # Unused pointer slots get beta: the kernels never read them (HAS_ALPHA, DELTA).
        alpha32 = beta32 if alpha is None else to_f32(alpha)
        xs = [to_f32(q), to_f32(k), to_f32(v), beta32, alpha32, beta32]
        s0 = to_f32(initial_state)
        scan = Scan(xs[0], xs[2], delta=True, has_alpha=alpha is not None, block_v=block_v, chunk=chunk)
        o, sT = scan.forward(xs, s0)
        ctx.save_for_backward(*xs[:5], s0)
        ctx.scan = scan
        ctx.dtypes = dtypes_of(q, k, v, beta, alpha, initial_state)
        out_dtype = torch.promote_types(q.dtype, v.dtype)
        return o.to(out_dtype), sT.to(state_dtype(out_dtype))

    @staticmethod
    def backward(ctx, do, dsT):
        q, k, v, beta, alpha, s0 = ctx.saved_tensors
        xs = [q, k, v, beta, alpha, beta]
        grads = ctx.scan.backward(xs, s0, to_f32(do), to_f32(dsT))
        dq, dk, dv, dbeta, dalpha, _, ds0 = grads
        grads = (dq, dk, dv, dbeta, dalpha, ds0)
        return tuple(cast_grad(g, d, n) for g, d, n in zip(grads, ctx.dtypes, ctx.needs_input_grad)) + (None, None)


def delta_rule_triton(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, alpha: Tensor | None = None, initial_state: Tensor | None = None,
    *, block_v: int | None = None, chunk: int | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Delta rule with Triton forward and backward; returns ``(o, final_state)``.

    q, k: (B, H, T, Dk); v: (B, H, T, Dv); beta, alpha: (B, H, T) (alpha None means 1);
    initial_state: (B, H, Dv, Dk) or None (zeros). ``o`` comes back in the inputs' dtype,
    the final state in fp32 for 16-bit inputs. ``block_v`` (rows per program, a power of
    two) and ``chunk`` (backward chunk length) are tuning/testing knobs.
    """
    check_shapes(("q", "k", "v", "beta", "alpha"), (q, k, v, beta, alpha), ("beta", "alpha"), initial_state)
    return DeltaRuleTriton.apply(q, k, v, beta, alpha, initial_state, block_v, chunk)
