"""Building blocks shared by the chunkwise-parallel forms.

Layout convention: sequences arrive as ``(B, H, T, D)`` (scalars per step as ``(B, H, T)``)
and are cut into ``N = ceil(T / C)`` chunks of ``C`` steps, giving ``(B, H, N, C, D)``.
Inside a chunk, index ``t`` is the step (0-based) and ``s`` an earlier-or-equal step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

# The delta rule's and the DPLR scan's chunk length. Measured on 2-core CPUs (T = 64..512,
# D = 16..64, fwd+bwd): 16 ties 32 at batch 8 and is ~25% faster at batch 64, where the
# (C, C) intermediates' memory traffic dominates.
DEFAULT_CHUNK_SIZE = 16


def pad_time(x: torch.Tensor, length: int, value: float, time_dim: int) -> torch.Tensor:
    """Right-pad ``x`` along ``time_dim`` to ``length`` steps with the constant ``value``.

    Padding steps are chosen by the caller to be identity steps of the recurrence (no write,
    no decay), so the state after the padded tail equals the state after step ``T``.
    """
    extra = length - x.shape[time_dim]
    if extra == 0:
        return x
    dim = time_dim % x.dim()
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, extra]
    return F.pad(x, pad, value=value)


def to_chunks(x: torch.Tensor, chunk_size: int, value: float) -> torch.Tensor:
    """``(B, H, T, D) -> (B, H, N, C, D)`` or ``(B, H, T) -> (B, H, N, C)``, right-padded with ``value``."""
    time_dim = 2
    t = x.shape[time_dim]
    n = -(-t // chunk_size)
    x = pad_time(x, n * chunk_size, value, time_dim)
    return x.reshape(*x.shape[:2], n, chunk_size, *x.shape[3:])


def from_chunks(x: torch.Tensor, length: int) -> torch.Tensor:
    """``(B, H, N, C, D) -> (B, H, T, D)``, dropping the padded tail beyond ``length``."""
    return x.reshape(*x.shape[:2], -1, *x.shape[4:])[:, :, :length]


def segment_products(g: torch.Tensor, time_dim: int) -> torch.Tensor:
    """Products of decays over half-open segments, ``P[t, s] = prod_{s < j <= t} g[j]``.

    ``g`` has the chunk axis at ``time_dim`` (size ``C``); the result inserts a new axis
    ``s`` right after it, so ``(..., C, ...) -> (..., C_t, C_s, ...)``. Entries with ``s > t``
    are exactly 0 and the diagonal is exactly 1.

    Computed as a cumulative product of a masked matrix rather than ``exp`` of differences
    of ``cumsum(log g)``: it needs no logarithm, so decays of exactly 0 (or of either sign)
    are handled as given, and no entry above the diagonal can overflow.
    """
    dim = time_dim % g.dim()
    c = g.shape[dim]
    rows = torch.arange(c, device=g.device)
    # later[t, s] is True where step t lies strictly after s: those factors enter the product.
    later = rows[:, None] > rows[None, :]
    mask_shape = [1] * (g.dim() + 1)
    mask_shape[dim] = c
    mask_shape[dim + 1] = c
    later = later.reshape(mask_shape)
    factors = torch.where(later, g.unsqueeze(dim + 1), torch.ones((), dtype=g.dtype, device=g.device))
    prod = torch.cumprod(factors, dim=dim)
    upper = (rows[:, None] < rows[None, :]).reshape(mask_shape)
    return prod.masked_fill(upper, 0.0)


def factorable(decay: torch.Tensor) -> bool:
    """Whether pairwise decays may be formed as ``decay[t] / decay[s]`` without losing digits.

    ``decay`` holds cumulative products from a chunk's start (so it only shrinks along the
    chunk). Splitting ``prod_{s<j<=t} g_j`` into ``decay[t] * (1 / decay[s])`` lets the decay
    ride on the vectors and turns ``O(C^2)`` (or ``O(C^2 D)``) elementwise work into a
    matmul. The split is exact up to rounding as long as neither factor under- or overflows:
    required here is ``min(decay) >= tiny ** 0.4`` (about 5e-16 in fp32, 1e-123 in fp64),
    which leaves most of the exponent range for the vectors themselves. Callers fall back
    to :func:`segment_products` otherwise (decays of 0, or very strong decay in one chunk).

    Off the CPU the answer is always False: reading the check back would synchronise with
    the device on every call and stall a launch-bound tiny model, while the segment
    products cost little there.
    """
    if decay.device.type != "cpu":
        return False
    floor = torch.finfo(decay.dtype).tiny ** 0.4
    # Under torch.func transforms (vmap over a seed pack) the tensor is a wrapper that cannot
    # drive Python control flow; decide on the whole underlying tensor instead: one branch
    # for every member, and each branch is exact.
    while torch._C._functorch.is_functorch_wrapped_tensor(decay):
        decay = torch._C._functorch.get_unwrapped(decay)
    lo, hi = torch.aminmax(decay.detach())
    return bool(lo >= floor) and bool(hi <= 1.0)


def unit_lower_solve(lower: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """Solve ``(I + L) X = rhs`` where ``L`` is the strictly lower part of ``lower`` (``(..., C, C)``).

    Entries of ``lower`` on and above the diagonal are neither read nor given a gradient
    (``unitriangular=True``), so callers need not mask them. This is the UT transform of the
    WY representation: forward substitution in one LAPACK call per matrix.

    Posed as the right-sided transposed system ``X^T (I + L)^T = rhs^T``: on CPU that layout
    reaches LAPACK without per-matrix copies and runs about twice as fast, forward and backward.
    """
    return torch.linalg.solve_triangular(lower.mT, rhs.mT, upper=True, left=False, unitriangular=True).mT


def chunk_state_pass(
    initial: torch.Tensor,
    u: torch.Tensor,
    w: torch.Tensor,
    k_end: torch.Tensor,
    decay_end: torch.Tensor | None,
    inject: torch.Tensor | None = None,
    sign: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Carry the state across chunks, resolving each chunk's state-dependent rows on the way.

    For each chunk ``n`` in order, with ``S`` the state entering it::

        P_n = U_n + sign * W_n S^T                     (C, Dv)   rows that depend on S
        S  <- S * decay_end_n + P_n^T K_n (+ inject_n)  (Dv, Dk)

    Args:
        initial: ``(B, H, Dv, Dk)``.
        u: ``(B, H, N, C, Dv)``; w: ``(B, H, N, C, Dk)``; k_end: ``(B, H, N, C, Dk)`` (keys
            decayed to the chunk's end).
        decay_end: the chunk's total decay, broadcastable to ``(B, H, N, Dv, Dk)`` (a scalar
            ``(..., 1, 1)`` or a per-key-channel ``(..., 1, Dk)``), or None for no decay.
        inject: optional ``(B, H, N, Dv, Dk)`` state-independent additions.

    Returns ``(before, p, final)``: the state entering each chunk ``(B, H, N, Dv, Dk)``, the
    resolved rows ``P`` ``(B, H, N, C, Dv)``, and the final state ``(B, H, Dv, Dk)``. Two small
    matmuls per chunk are the only sequential work; everything else is batched by the caller.

    Outside torch.func transforms the pass is one autograd node (:class:`_StatePass`) whose
    backward runs the reverse recurrence with two small matmuls per chunk and batches the
    rest over chunks: recording ~5 autograd nodes per chunk and walking them back cost more
    than the arithmetic at the small states the studies use (about 2x on the pass at B 8,
    T 256, D 32, C 16). Under transforms (seed packs' vmap) the traced loop below runs.
    """
    if not any(
        torch._C._functorch.is_functorch_wrapped_tensor(x)
        for x in (initial, u, w, k_end, decay_end, inject)
        if x is not None
    ):
        return _StatePass.apply(initial, u, w, k_end, decay_end, inject, sign)
    return _state_pass_traced(initial, u, w, k_end, decay_end, inject, sign)


def _state_pass_traced(
    initial: torch.Tensor,
    u: torch.Tensor,
    w: torch.Tensor,
    k_end: torch.Tensor,
    decay_end: torch.Tensor | None,
    inject: torch.Tensor | None,
    sign: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`chunk_state_pass` as plain differentiable ops (the form torch.func can transform)."""
    b, h, n_chunks = u.shape[:3]
    flat = lambda x: x.flatten(0, 1)  # noqa: E731  (B*H batches for baddbmm)
    state = flat(initial)
    # unbind, not indexing: indexing's backward would zero-fill a full-size gradient per chunk.
    us, ws, ks = flat(u).unbind(1), flat(w).unbind(1), flat(k_end).unbind(1)
    decays = None if decay_end is None else flat(decay_end.expand(b, h, n_chunks, *decay_end.shape[3:])).unbind(1)
    injects = None if inject is None else flat(inject).unbind(1)
    befores, rows, state = _carry(state, us, ws, ks, decays, injects, sign)
    unflat = lambda x: x.unflatten(0, (b, h))  # noqa: E731
    return unflat(torch.stack(befores, 1)), unflat(torch.stack(rows, 1)), unflat(state)


def _carry(
    state: torch.Tensor,
    us: Sequence[torch.Tensor],
    ws: Sequence[torch.Tensor],
    ks: Sequence[torch.Tensor],
    decays: Sequence[torch.Tensor] | None,
    injects: Sequence[torch.Tensor] | None,
    sign: float,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """The forward pass over the chunks' ``(B*H, ...)`` slices: the states entering each chunk,
    the resolved rows ``P`` of each, and the final state."""
    befores, rows = [], []
    for i in range(len(us)):
        befores.append(state)
        p_i = torch.baddbmm(us[i], ws[i], state.transpose(-1, -2), alpha=sign)
        rows.append(p_i)
        kept = state if decays is None else state * decays[i]
        if injects is not None:
            kept = kept + injects[i]
        state = torch.baddbmm(kept, p_i.transpose(-1, -2), ks[i])
    return befores, rows, state


class _StatePass(torch.autograd.Function):
    """:func:`chunk_state_pass` as one node; the backward is the reverse recurrence.

    With ``S_i`` the state entering chunk ``i`` and ``d_i`` its decay, forward is
    ``P_i = U_i + sign W_i S_i^T``, ``S_{i+1} = S_i d_i + J_i + P_i^T K_i``. Going back with
    ``G_{i+1} = dL/dS_{i+1}``: ``dP_i = gP_i + K_i G_{i+1}^T`` and ``G_i = G_{i+1} d_i +
    sign dP_i^T W_i + gBefore_i`` are the only sequential steps; ``dK = P G``, ``dW = sign dP S``,
    ``dd = sum(G * S)`` and ``dJ = G`` are then batched over all chunks.
    """

    @staticmethod
    def forward(ctx, initial, u, w, k_end, decay_end, inject, sign):  # type: ignore[override]
        b, h, n_chunks = u.shape[:3]
        dv, dk = initial.shape[-2:]
        state = initial.flatten(0, 1)
        u_f, w_f, k_f = u.flatten(0, 1), w.flatten(0, 1), k_end.flatten(0, 1)
        decays = None if decay_end is None else decay_end.expand(b, h, n_chunks, *decay_end.shape[3:]).flatten(0, 1)
        inj = None if inject is None else inject.flatten(0, 1)
        us, ws, ks = u_f.unbind(1), w_f.unbind(1), k_f.unbind(1)
        ds = None if decays is None else decays.unbind(1)
        injs = None if inj is None else inj.unbind(1)
        befores, ps, state = _carry(state, us, ws, ks, ds, injs, sign)
        before, rows = torch.stack(befores, 1), torch.stack(ps, 1)
        ctx.sign = sign
        ctx.decay_shape = None if decay_end is None else decay_end.shape
        ctx.has_inject = inject is not None
        ctx.save_for_backward(before, rows, w_f, k_f, decays)
        return before.unflatten(0, (b, h)), rows.unflatten(0, (b, h)), state.unflatten(0, (b, h))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_before, g_rows, g_final):  # type: ignore[override]
        before, rows, w_f, k_f, decays = ctx.saved_tensors
        sign = ctx.sign
        bh, n_chunks = before.shape[:2]
        b_, h_ = g_before.shape[:2] if g_before is not None else g_rows.shape[:2]
        g_state = torch.zeros_like(before[:, 0]) if g_final is None else g_final.flatten(0, 1).clone()
        g_b = None if g_before is None else g_before.flatten(0, 1)
        g_r = None if g_rows is None else g_rows.flatten(0, 1)
        ks, ws = k_f.unbind(1), w_f.unbind(1)
        ds = None if decays is None else decays.unbind(1)
        grs = None if g_r is None else g_r.unbind(1)
        gbs = None if g_b is None else g_b.unbind(1)
        g_afters, g_ps = [], []  # dL/dS_{i+1}; dL/dP_i including the path through S_{i+1}
        for i in range(n_chunks - 1, -1, -1):
            g_afters.append(g_state)
            g_t = g_state.transpose(-1, -2)
            g_p_i = torch.bmm(ks[i], g_t) if grs is None else torch.baddbmm(grs[i], ks[i], g_t)
            g_ps.append(g_p_i)
            carried = g_state if ds is None else g_state * ds[i]
            if gbs is not None:
                carried = carried + gbs[i]
            g_state = torch.baddbmm(carried, g_p_i.transpose(-1, -2), ws[i], alpha=sign)
        g_after, g_p = torch.stack(g_afters[::-1], 1), torch.stack(g_ps[::-1], 1)
        unflat = lambda x: x.unflatten(0, (b_, h_))  # noqa: E731
        g_u = unflat(g_p) if ctx.needs_input_grad[1] else None
        g_w = unflat(torch.matmul(g_p, before) * sign) if ctx.needs_input_grad[2] else None
        g_k = unflat(torch.matmul(rows, g_after)) if ctx.needs_input_grad[3] else None
        g_decay = None
        if ctx.decay_shape is not None and ctx.needs_input_grad[4]:
            g_decay = unflat(g_after * before).sum_to_size(ctx.decay_shape)
        g_inject = unflat(g_after) if ctx.has_inject and ctx.needs_input_grad[5] else None
        g_initial = unflat(g_state) if ctx.needs_input_grad[0] else None
        return g_initial, g_u, g_w, g_k, g_decay, g_inject, None
