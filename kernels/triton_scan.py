"""Pascal-safe Triton kernels shared by the delta rule's and the DPLR (RWKV-7 style) scan's
Triton forms (``kernels/delta_rule/triton.py``, ``kernels/dplr/triton.py``).

Both operators are one recurrence over a state ``S`` in R^{Dv x Dk} per (batch, head):

    S_t = S_{t-1} diag(w_t) - (S_{t-1} u_t) kappa_t^T + v_t key_t^T,      o_t = S_t r_t

DPLR (``dplr_scan``):  r, key = k, v, w, kappa as given, u = a * kappa, so that
    S_t = S_{t-1} A_t + v_t k_t^T with A_t = diag(w_t) - (a_t * kappa_t) kappa_t^T.
    ``kappa`` is used as given: normalising it (the paper's kappa-hat) is the caller's job.
Delta rule (``delta_rule``):  r = q, key = kappa = k, w = alpha (a scalar per step, 1 when
    None), u = alpha * beta * k, and v is replaced by beta * v, so that
    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T.

Shapes: r/q, k, w, kappa, a are (B, H, T, Dk); v and o are (B, H, T, Dv); beta and alpha
are (B, H, T); states are (B, H, Dv, Dk). ``o_t`` reads the state *after* step t.

Written so it compiles for sm_61 (GTX 1070), and checked by compiling ahead of time for
that target in the tests:
  * fp32 only inside the kernels: inputs are cast to fp32 on the way in, outputs back to
    the input dtype on the way out (bf16 never reaches a kernel);
  * elementwise products and ``tl.sum`` reductions only: no ``tl.dot`` (head dims are tiny
    and Pascal has no tensor cores) and no atomics anywhere;
  * head dims are padded to powers of two with masks (``tl.arange`` needs them), so
    Dk = 6 or Dv = 37 work; padded lanes load as 0 and stay 0 through the recurrence.

Parallel layout: one program per (batch*head, block of Dv rows). The rows of S evolve
independently (row i only sees v_t[i]), so splitting Dv costs nothing in the forward; in
the backward the gradients that sum over rows (dk, dr, dw, dkappa, da, dbeta, dalpha) are
written as one partial per row block to separate buffers and summed in PyTorch afterwards.
No two programs ever write the same address, and results are bitwise deterministic.

Backward: two passes, no atomics.
  Pass 1 (``_state_grad_kernel``), reverse time: carries G_t = dL/dS_t, using only the
    transition (G_{t-1} += G_t A_t^T, G_t += do_t r_t^T); it never needs S. It stores G at
    every chunk boundary (the gradient flowing into the chunk's last state from later
    steps) and the gradient of the initial state.
  Pass 2 (``_input_grad_kernel``), forward over chunks: carries S forward from the initial
    state, recomputing each chunk's states into a per-program scratch buffer, then walks
    the chunk backwards from pass 1's boundary G, producing every input gradient.

Memory/recompute trade-off: the forward saves nothing but its inputs (no per-step or
per-chunk states); the backward recomputes the forward once. Extra memory in the backward
is ``ceil(T/C)`` boundary gradients plus ``C`` scratch states per program, with the chunk
``C = max(8, ceil(sqrt(T)))`` minimising their sum: 46 states instead of 512 at T = 512.
Cost: fwd+bwd is about four sequential sweeps over time of O(Dv*Dk) work per step; each
loop prefetches the next step's inputs so memory latency overlaps the previous step's math.
Not measured on a GPU yet (no device in the session that wrote this): tests/gpu/check.sh
runs the tests and ``orchestrator bench kernels`` when one is lent.
"""

from __future__ import annotations

import math
from typing import Any, overload

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# Cap on a program's Dv rows: a 32 x Dk fp32 tile keeps register pressure moderate at
# Dk = 128 while leaving B*H*ceil(Dv/32) programs to fill the GPU.
MAX_BLOCK_V = 32
# Fused multiply-add in the kernels (fewer roundings); explicit so results do not depend on
# the TRITON_DEFAULT_FP_FUSION default, which Triton 3.10 flips.
FP_FUSION = True


@triton.jit
def _lanes(DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """This program's key lanes and block of value rows (program axis 1), with their masks."""
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    return offs_k, offs_k < DK, offs_v, offs_v < DV


@triton.jit
def _load_raw(
    r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr, tok,
    DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    DELTA: tl.constexpr, HAS_ALPHA: tl.constexpr,
):  # fmt: skip
    """The inputs of step ``tok`` (= bh*T + t) as stored: (r, k, v, x1, x2, x3).

    Delta rule: x1 = beta, x2 = alpha (1 when absent), x3 = beta again (a placeholder that
    keeps the tuple's types fixed). DPLR: x1 = w, x2 = kappa, x3 = a.
    """
    offs_k, mask_k, offs_v, mask_v = _lanes(DK, DV, BLOCK_K, BLOCK_V)
    r = tl.load(r_ptr + tok * DK + offs_k, mask=mask_k, other=0.0)
    key = tl.load(k_ptr + tok * DK + offs_k, mask=mask_k, other=0.0)
    v = tl.load(v_ptr + tok * DV + offs_v, mask=mask_v, other=0.0)
    if DELTA:
        x1 = tl.load(x1_ptr + tok)
        if HAS_ALPHA:
            x2 = tl.load(x2_ptr + tok)
        else:
            x2 = x1 * 0.0 + 1.0
        x3 = x1
    else:
        x1 = tl.load(x1_ptr + tok * DK + offs_k, mask=mask_k, other=0.0)
        x2 = tl.load(x2_ptr + tok * DK + offs_k, mask=mask_k, other=0.0)
        x3 = tl.load(x3_ptr + tok * DK + offs_k, mask=mask_k, other=0.0)
    return r, key, v, x1, x2, x3


@triton.jit
def _transition(key, v, x1, x2, x3, BLOCK_K: tl.constexpr, DELTA: tl.constexpr):
    """(val, w, kappa, u) of the common recurrence from a step's stored inputs."""
    if DELTA:  # val = beta v, w = alpha, kappa = k, u = alpha beta k
        val = v * x1
        w = tl.zeros([BLOCK_K], dtype=tl.float32) + x2
        kappa = key
        u = key * (x2 * x1)
    else:  # w, kappa as given, u = a * kappa
        val = v
        w = x1
        kappa = x2
        u = x3 * x2
    return val, w, kappa, u


@triton.jit
def _advance(S, key, val, w, kappa, u):
    """One step forward: ``S diag(w) - (S u) kappa^T + val key^T``."""
    p = tl.sum(S * u[None, :], axis=1)
    return S * w[None, :] - p[:, None] * kappa[None, :] + val[:, None] * key[None, :]


# The kernels' parameters are grouped by role (inputs, outputs and scratch, sizes, variant
# flags) by hand; the formatter would put each on its own line.

# Every loop below loads step t+1's inputs (t-1's in reverse) before computing step t, so the
# global-memory latency overlaps the arithmetic instead of stalling each step of the chain;
# the index is clamped so the last prefetch re-reads an in-bounds step and is discarded.


@triton.jit
def _forward_kernel(
    r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr,  # every step's inputs, as _load_raw reads them
    s0_ptr, o_ptr, sT_ptr, T,
    DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    DELTA: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_S0: tl.constexpr,
):  # fmt: skip
    """Grid (B*H, ceil(Dv/BLOCK_V)): S rows of one block in registers, one step per iteration."""
    bh = tl.program_id(0).to(tl.int64)
    offs_k, mask_k, offs_v, mask_v = _lanes(DK, DV, BLOCK_K, BLOCK_V)
    mask_s = mask_v[:, None] & mask_k[None, :]
    s_offs = bh * DV * DK + offs_v[:, None] * DK + offs_k[None, :]
    if HAS_S0:
        S = tl.load(s0_ptr + s_offs, mask=mask_s, other=0.0)
    else:
        S = tl.zeros([BLOCK_V, BLOCK_K], dtype=tl.float32)
    nr, nk, nv, n1, n2, n3 = _load_raw(
        r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr, bh * T, DK, DV, BLOCK_K, BLOCK_V, DELTA, HAS_ALPHA
    )
    for t in range(0, T):
        r, key, v, x1, x2, x3 = nr, nk, nv, n1, n2, n3
        nxt = bh * T + tl.minimum(t + 1, T - 1)
        nr, nk, nv, n1, n2, n3 = _load_raw(
            r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr, nxt, DK, DV, BLOCK_K, BLOCK_V, DELTA, HAS_ALPHA
        )
        val, w, kappa, u = _transition(key, v, x1, x2, x3, BLOCK_K, DELTA)
        S = _advance(S, key, val, w, kappa, u)
        o = tl.sum(S * r[None, :], axis=1)
        tl.store(o_ptr + (bh * T + t) * DV + offs_v, o, mask=mask_v)
    tl.store(sT_ptr + s_offs, S, mask=mask_s)


@triton.jit
def _state_grad_kernel(
    r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr,  # every step's inputs, as _load_raw reads them
    do_ptr, dsT_ptr, gc_ptr, ds0_ptr, T, CHUNK, NC,
    DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    DELTA: tl.constexpr, HAS_ALPHA: tl.constexpr,
):  # fmt: skip
    """Pass 1, reverse time. gc[(bh, vb), c] = dL/dS at chunk c's last step from later steps only."""
    bh = tl.program_id(0).to(tl.int64)
    vb = tl.program_id(1)
    offs_k, mask_k, offs_v, mask_v = _lanes(DK, DV, BLOCK_K, BLOCK_V)
    mask_s = mask_v[:, None] & mask_k[None, :]
    s_offs = bh * DV * DK + offs_v[:, None] * DK + offs_k[None, :]
    tile = tl.arange(0, BLOCK_V)[:, None] * BLOCK_K + offs_k[None, :]
    gc_base = (bh * tl.num_programs(1) + vb) * NC * BLOCK_V * BLOCK_K
    G = tl.load(dsT_ptr + s_offs, mask=mask_s, other=0.0)
    last = bh * T + T - 1
    nr, nk, nv, n1, n2, n3 = _load_raw(
        r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr, last, DK, DV, BLOCK_K, BLOCK_V, DELTA, HAS_ALPHA
    )
    ndo = tl.load(do_ptr + last * DV + offs_v, mask=mask_v, other=0.0)
    for i in range(0, T):
        t = T - 1 - i
        if (t % CHUNK == CHUNK - 1) | (t == T - 1):
            tl.store(gc_ptr + gc_base + (t // CHUNK) * BLOCK_V * BLOCK_K + tile, G)
        r, key, v, x1, x2, x3, do = nr, nk, nv, n1, n2, n3, ndo
        prev = bh * T + tl.maximum(t - 1, 0)
        nr, nk, nv, n1, n2, n3 = _load_raw(
            r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr, prev, DK, DV, BLOCK_K, BLOCK_V, DELTA, HAS_ALPHA
        )
        ndo = tl.load(do_ptr + prev * DV + offs_v, mask=mask_v, other=0.0)
        val, w, kappa, u = _transition(key, v, x1, x2, x3, BLOCK_K, DELTA)
        G = G + do[:, None] * r[None, :]
        gk = tl.sum(G * kappa[None, :], axis=1)
        G = G * w[None, :] - gk[:, None] * u[None, :]
    tl.store(ds0_ptr + s_offs, G, mask=mask_s)


@triton.jit
def _input_grad_kernel(
    r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr,  # every step's inputs, as _load_raw reads them
    s0_ptr, do_ptr, gc_ptr, scratch_ptr,
    dr_ptr, dk_ptr, dv_ptr, dx1_ptr, dx2_ptr, dx3_ptr,
    T, CHUNK, NC, BH,
    DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    DELTA: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_S0: tl.constexpr,
):  # fmt: skip
    """Pass 2, forward over chunks: recompute a chunk's states, then walk it backwards.

    Row-summed gradients go to partial buffers indexed (vb, bh, t, :) (or (vb, bh, t) for the
    delta rule's beta/alpha); dv rows belong to this program alone and are written directly.
    Delta: dx1 = dbeta, dx2 = dalpha. DPLR: dx1 = dw, dx2 = dkappa, dx3 = da.
    """
    bh = tl.program_id(0).to(tl.int64)
    vb = tl.program_id(1)
    offs_k, mask_k, offs_v, mask_v = _lanes(DK, DV, BLOCK_K, BLOCK_V)
    mask_s = mask_v[:, None] & mask_k[None, :]
    tile = tl.arange(0, BLOCK_V)[:, None] * BLOCK_K + offs_k[None, :]
    TILE: tl.constexpr = BLOCK_V * BLOCK_K
    prog = bh * tl.num_programs(1) + vb
    gc_base = prog * NC * TILE
    scratch = scratch_ptr + prog * CHUNK * TILE + tile
    part = vb * BH + bh  # row of this program's partial-gradient buffers
    if HAS_S0:
        S = tl.load(s0_ptr + bh * DV * DK + offs_v[:, None] * DK + offs_k[None, :], mask=mask_s, other=0.0)
    else:
        S = tl.zeros([BLOCK_V, BLOCK_K], dtype=tl.float32)
    for c in range(0, NC):
        t0 = c * CHUNK
        t1 = tl.minimum(t0 + CHUNK, T)
        # Forward through the chunk: keep S_{t-1} for the backward walk; dr needs only S_t.
        first = bh * T + t0
        nr, nk, nv, n1, n2, n3 = _load_raw(
            r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr, first, DK, DV, BLOCK_K, BLOCK_V, DELTA, HAS_ALPHA
        )
        ndo = tl.load(do_ptr + first * DV + offs_v, mask=mask_v, other=0.0)
        for t in range(t0, t1):
            tl.store(scratch + (t - t0) * TILE, S)
            r, key, v, x1, x2, x3, do = nr, nk, nv, n1, n2, n3, ndo
            nxt = bh * T + tl.minimum(t + 1, t1 - 1)
            nr, nk, nv, n1, n2, n3 = _load_raw(
                r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr, nxt, DK, DV, BLOCK_K, BLOCK_V, DELTA, HAS_ALPHA
            )
            ndo = tl.load(do_ptr + nxt * DV + offs_v, mask=mask_v, other=0.0)
            val, w, kappa, u = _transition(key, v, x1, x2, x3, BLOCK_K, DELTA)
            S = _advance(S, key, val, w, kappa, u)
            dr = tl.sum(S * do[:, None], axis=0)
            tl.store(dr_ptr + (part * T + t) * DK + offs_k, dr, mask=mask_k)
        # Scratch written by one thread may be read by another: fence the block.
        tl.debug_barrier()
        G = tl.load(gc_ptr + gc_base + c * TILE + tile)
        last = bh * T + t1 - 1
        nr, nk, nv, n1, n2, n3 = _load_raw(
            r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr, last, DK, DV, BLOCK_K, BLOCK_V, DELTA, HAS_ALPHA
        )
        ndo = tl.load(do_ptr + last * DV + offs_v, mask=mask_v, other=0.0)
        nSp = tl.load(scratch + (t1 - 1 - t0) * TILE)
        for i in range(0, t1 - t0):
            t = t1 - 1 - i
            r, key, v, x1, x2, x3, do, Sp = nr, nk, nv, n1, n2, n3, ndo, nSp
            t_prev = tl.maximum(t - 1, t0)
            prev = bh * T + t_prev
            nr, nk, nv, n1, n2, n3 = _load_raw(
                r_ptr, k_ptr, v_ptr, x1_ptr, x2_ptr, x3_ptr, prev, DK, DV, BLOCK_K, BLOCK_V, DELTA, HAS_ALPHA
            )
            ndo = tl.load(do_ptr + prev * DV + offs_v, mask=mask_v, other=0.0)
            nSp = tl.load(scratch + (t_prev - t0) * TILE)
            val, w, kappa, u = _transition(key, v, x1, x2, x3, BLOCK_K, DELTA)
            G = G + do[:, None] * r[None, :]
            d_key = tl.sum(G * val[:, None], axis=0)
            d_val = tl.sum(G * key[None, :], axis=1)
            d_w = tl.sum(Sp * G, axis=0)
            p = tl.sum(Sp * u[None, :], axis=1)
            d_kappa = -tl.sum(G * p[:, None], axis=0)
            gk = tl.sum(G * kappa[None, :], axis=1)
            d_u = -tl.sum(Sp * gk[:, None], axis=0)
            tok = bh * T + t
            row = (part * T + t) * DK + offs_k
            if DELTA:  # x1 = beta, x2 = alpha, v = raw v; chain rule through val, w, kappa, u
                tl.store(dk_ptr + row, d_key + d_kappa + d_u * (x2 * x1), mask=mask_k)
                tl.store(dv_ptr + tok * DV + offs_v, d_val * x1, mask=mask_v)
                du_k = tl.sum(d_u * key, axis=0)
                tl.store(dx1_ptr + part * T + t, du_k * x2 + tl.sum(d_val * v, axis=0))
                if HAS_ALPHA:
                    tl.store(dx2_ptr + part * T + t, tl.sum(d_w, axis=0) + du_k * x1)
            else:  # x3 = a; u = a * kappa
                tl.store(dk_ptr + row, d_key, mask=mask_k)
                tl.store(dv_ptr + tok * DV + offs_v, d_val, mask=mask_v)
                tl.store(dx1_ptr + row, d_w, mask=mask_k)
                tl.store(dx2_ptr + row, d_kappa + d_u * x3, mask=mask_k)
                tl.store(dx3_ptr + row, d_u * kappa, mask=mask_k)
            G = G * w[None, :] - gk[:, None] * u[None, :]
        # The next chunk overwrites the scratch this walk has just read.
        tl.debug_barrier()


# ---------------------------------------------------------------------------------------
# Host side

# Kernels built by the interpreter (TRITON_INTERPRET=1 before triton was imported) run on CPU.
INTERPRETED = isinstance(_forward_kernel, InterpretedFunction)


def default_chunk(T: int) -> int:
    """Steps per backward chunk: about sqrt(T), which minimises boundary + scratch states."""
    return max(8, math.ceil(math.sqrt(max(T, 1))))


def _blocks(dk: int, dv: int, block_v: int | None) -> tuple[int, int, int]:
    block_k = triton.next_power_of_2(dk)
    if block_v is None:
        block_v = min(triton.next_power_of_2(dv), MAX_BLOCK_V)
    if block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two, got {block_v}")
    return block_k, block_v, triton.cdiv(dv, block_v)


def _num_warps(block_v: int, block_k: int) -> int:
    # About 16 fp32 elements of a tile per thread; more warps only add reduction traffic.
    return max(1, min(8, block_v * block_k // 512))


def check_device(x: torch.Tensor) -> None:
    """Refuse a tensor the kernels cannot run on: off CUDA unless interpreted."""
    if x.device.type != "cuda" and not INTERPRETED:
        raise RuntimeError(
            f"triton kernels need CUDA tensors, got {x.device}; on CPU set TRITON_INTERPRET=1 "
            "before triton is first imported (slow, for tests) or use impl='chunk'"
        )


@overload
def to_f32(x: torch.Tensor) -> torch.Tensor: ...
@overload
def to_f32(x: None) -> None: ...
def to_f32(x: torch.Tensor | None) -> torch.Tensor | None:
    """What a kernel reads: a detached, contiguous float32 copy (None stays None)."""
    return None if x is None else x.detach().to(torch.float32).contiguous()


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    # Same rule as kernels.dispatch.compute_dtype: a bf16/fp16 caller gets an fp32 state.
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


class Scan:
    """Shapes, launch parameters and the three launches shared by both operators' forms."""

    def __init__(
        self, r: torch.Tensor, v: torch.Tensor, delta: bool, has_alpha: bool, block_v: int | None, chunk: int | None
    ) -> None:
        B, H, T, DK = r.shape
        self.B, self.H, self.T, self.DK, self.DV = B, H, T, DK, v.shape[-1]
        self.BK, self.BV, self.NV = _blocks(DK, self.DV, block_v)
        self.chunk = default_chunk(T) if chunk is None else int(chunk)
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.NC = triton.cdiv(T, self.chunk)
        self.delta, self.has_alpha = delta, has_alpha
        self.meta = dict(
            DK=DK,
            DV=self.DV,
            BLOCK_K=self.BK,
            BLOCK_V=self.BV,
            DELTA=delta,
            HAS_ALPHA=has_alpha,
            num_warps=_num_warps(self.BV, self.BK),
            enable_fp_fusion=FP_FUSION,
        )
        self.grid = (B * H, self.NV)
        self.empty = B * H * T == 0

    def forward(self, xs: list, s0: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        r = xs[0]
        o = torch.empty(self.B, self.H, self.T, self.DV, device=r.device, dtype=torch.float32)
        sT = torch.empty(self.B, self.H, self.DV, self.DK, device=r.device, dtype=torch.float32)
        if self.empty:  # nothing to launch (and no zero-size grid or null pointers to pass)
            return o, (s0.clone() if s0 is not None else sT.zero_())
        _forward_kernel[self.grid](*xs, s0 if s0 is not None else o, o, sT, self.T, HAS_S0=s0 is not None, **self.meta)
        return o, sT

    def backward(self, xs: list, s0: torch.Tensor | None, do: torch.Tensor, dsT: torch.Tensor):
        """Returns (dr, dk, dv, dx1, dx2, dx3, ds0); dx* are summed over row blocks."""
        dev, BH, T, NV = do.device, self.B * self.H, self.T, self.NV
        f32: dict[str, Any] = dict(device=dev, dtype=torch.float32)
        tile = self.BV * self.BK
        gc = torch.empty(BH * NV * self.NC * tile, **f32)
        scratch = torch.empty(BH * NV * self.chunk * tile, **f32)
        ds0 = torch.empty(self.B, self.H, self.DV, self.DK, **f32)
        if self.empty:
            z = torch.zeros(self.B, self.H, T, self.DK, **f32)
            dv = torch.zeros(self.B, self.H, T, self.DV, **f32)
            zs = torch.zeros(self.B, self.H, T, **f32)
            if self.delta:
                return z, z.clone(), dv, zs, (zs.clone() if self.has_alpha else None), None, dsT.clone()
            return z, z.clone(), dv, z.clone(), z.clone(), z.clone(), dsT.clone()
        _state_grad_kernel[self.grid](*xs, do, dsT, gc, ds0, T, self.chunk, self.NC, **self.meta)
        vec = (NV, self.B, self.H, T, self.DK)
        scal = (NV, self.B, self.H, T)
        dr, dk = torch.empty(vec, **f32), torch.empty(vec, **f32)
        dv = torch.empty(self.B, self.H, T, self.DV, **f32)
        dx2: torch.Tensor | None  # summed over row blocks below, or None where the op has no such input
        dx3: torch.Tensor | None
        if self.delta:
            dx1 = torch.empty(scal, **f32)
            dx2 = torch.empty(scal, **f32) if self.has_alpha else dx1
            dx3 = dx1  # unused by the delta rule
        else:
            dx1, dx2, dx3 = (torch.empty(vec, **f32) for _ in range(3))
        _input_grad_kernel[self.grid](
            *xs,
            s0 if s0 is not None else do,
            do,
            gc,
            scratch,
            dr,
            dk,
            dv,
            dx1,
            dx2,
            dx3,
            T,
            self.chunk,
            self.NC,
            BH,
            HAS_S0=s0 is not None,
            **self.meta,
        )
        dx2 = dx2.sum(0) if (not self.delta or self.has_alpha) else None
        dx3 = None if self.delta else dx3.sum(0)
        return dr.sum(0), dk.sum(0), dv, dx1.sum(0), dx2, dx3, ds0


def dtypes_of(*xs: torch.Tensor | None) -> tuple[torch.dtype | None, ...]:
    # dtypes only: holding the caller's tensors on ctx would keep them alive.
    return tuple(None if x is None else x.dtype for x in xs)


def cast_grad(g: torch.Tensor | None, dtype: torch.dtype | None, needed: bool) -> torch.Tensor | None:
    """An input's gradient in the input's dtype, or None where it was not given or not needed."""
    if dtype is None or not needed or g is None:
        return None
    return g.to(dtype)


def check_shapes(names: tuple[str, ...], xs: tuple, scalar: tuple[str, ...], state: torch.Tensor | None) -> None:
    """Raise ValueError unless every input has its operator's shape and the first input's device."""
    B, H, T, DK = xs[0].shape
    DV = xs[2].shape[-1]
    for name, x in zip(names, xs):
        if x is None:
            continue
        want = (B, H, T) if name in scalar else (B, H, T, DV) if name == "v" else (B, H, T, DK)
        if tuple(x.shape) != want:
            raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")
        if x.device != xs[0].device:
            raise ValueError(f"{name} is on {x.device} but {names[0]} is on {xs[0].device}")
    if state is not None and tuple(state.shape) != (B, H, DV, DK):
        raise ValueError(f"initial_state must have shape {(B, H, DV, DK)}, got {tuple(state.shape)}")
