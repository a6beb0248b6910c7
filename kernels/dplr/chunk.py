"""The DPLR scan's chunkwise-parallel form (a unit lower-triangular solve per chunk)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.chunking import DEFAULT_CHUNK_SIZE
from kernels.chunking import chunk_state_pass, factorable, from_chunks, segment_products, to_chunks, unit_lower_solve
from kernels.dispatch import check_chunk_size


def dplr_scan_chunk(
    r: Tensor, k: Tensor, v: Tensor, w: Tensor, kappa: Tensor, a: Tensor,
    *, initial_state: Tensor | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Chunkwise-parallel form, exact up to rounding.

    Within a chunk with entering state ``S0`` write ``A_t = diag(w_t) + x_t kappa_t^T`` with
    ``x_t = -(a_t * kappa_t)``, and let ``p_t = S_{t-1} x_t`` (what step ``t`` removes).
    With per-channel decays ``D[t, s] = prod_{s<j<=t} w_j`` (a ``(C, C, Dk)`` tensor) and
    ``D0[t] = prod_{j<=t} w_j``::

        S_t = S0 diag(D0[t]) + sum_{s<=t} (p_s (kappa_s * D[t,s])^T + v_s (k_s * D[t,s])^T)
        p_t = S0 (D0[t-1] * x_t) + sum_{s<t} (p_s <x_t, kappa_s>_{D[t-1,s]} + v_s <x_t, k_s>_{D[t-1,s]})

    where ``<x, y>_D = sum_i x_i y_i D_i``. The second line is a unit lower-triangular system
    for the rows of ``P``, solved once per chunk without the state (``P = Ut + W S0^T``).
    Only that product and the state update run chunk after chunk (two small matmuls each);
    ``O = <r, kappa>_D P + <r, k>_D V + (D0 * R) S0^T`` is then batched over all chunks.

    The decay-weighted products ``<x, y>_D`` are formed in one of two ways, both exact up
    to rounding. When the chunk's cumulative decays are safely representable
    (:func:`kernels.chunking.factorable`: ``D0 >= ~5e-16`` in fp32, always true for RWKV-7's
    ``w > 0.545`` at the default chunk), ``D[t, s] = D0[t] / D0[s]`` rides on the vectors and
    the four pair matrices are plain matmuls. Otherwise (``w`` at or near 0) the explicit
    ``(C, C, Dk)`` segment products are used: no ratios, nothing can overflow, ``O(C^2 Dk)``
    elementwise work per chunk.
    """
    b, h, t_len, dk = r.shape
    dv = v.shape[-1]
    c = min(check_chunk_size(chunk_size), t_len)
    # Padding steps have w = 1 and k = v = a = kappa = 0: A_t = I and no write.
    rc, kc, vc = to_chunks(r, c, 0.0), to_chunks(k, c, 0.0), to_chunks(v, c, 0.0)
    wc, kap = to_chunks(w, c, 1.0), to_chunks(kappa, c, 0.0)
    remove = -(to_chunks(a, c, 0.0) * kap)  # x_t, (B, H, N, C, Dk)

    decay = torch.cumprod(wc, dim=-2)  # D0[t]
    decay_prev = F.pad(decay[..., :-1, :], (0, 0, 1, 0), value=1.0)  # D0[t-1]
    remove_in = decay_prev * remove  # D0[t-1] * x_t
    if factorable(decay):
        pairs = _pairs_factored(rc, remove_in, kc, kap, decay)
    else:
        pairs = _pairs_segmented(rc, remove, kc, kap, wc)
    read_kap, read_k, rem_kap, rem_k, kap_end, k_end = pairs

    rhs = torch.cat([remove_in, rem_k @ vc], dim=-1)
    w_rows, u_rows = unit_lower_solve(-rem_kap, rhs).split([dk, dv], dim=-1)  # P = W S0^T + Ut
    inject = vc.transpose(-1, -2) @ k_end  # the chunk's own writes, decayed to its end
    state0 = r.new_zeros(b, h, dv, dk) if initial_state is None else initial_state
    # P = Ut + W S0^T, and S0 -> S0 diag(D0[C]) + P^T (kappa * D[C, .]) + V^T (k * D[C, .]).
    before, p_rows, final = chunk_state_pass(state0, u_rows, w_rows, kap_end, decay[..., -1:, :], inject)
    out = read_kap @ p_rows + read_k @ vc + (decay * rc) @ before.transpose(-1, -2)
    return from_chunks(out, t_len), final


Pairs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _pairs_factored(rc: Tensor, remove_in: Tensor, kc: Tensor, kap: Tensor, decay: Tensor) -> Pairs:
    """Decay-weighted pair matrices with ``D[t, s] = D0[t] / D0[s]`` carried by the vectors.

    Only valid when :func:`kernels.chunking.factorable` holds for ``decay`` (``D0``); then
    every pair matrix is one ``(C, Dk) @ (Dk, C)`` matmul.
    Returns ``(read_kap, read_k, rem_kap, rem_k, kap_end, k_end)``: the ``(C, C)`` matrices
    ``<r_t, kappa_s>_{D[t,s]}`` and ``<r_t, k_s>_{D[t,s]}`` (``s <= t``),
    ``<x_t, kappa_s>_{D[t-1,s]}`` and ``<x_t, k_s>_{D[t-1,s]}`` (``s < t``), and the
    ``(C, Dk)`` rows ``kappa_s * D[C,s]``, ``k_s * D[C,s]``.
    """
    kap_in, k_in = kap / decay, kc / decay
    read_in = decay * rc
    read_kap, read_k = (read_in @ kap_in.mT).tril(), (read_in @ k_in.mT).tril()
    # rem_kap's upper triangle is never read by the triangular solve, so it stays unmasked.
    rem_kap, rem_k = remove_in @ kap_in.mT, (remove_in @ k_in.mT).tril(-1)
    end = decay[..., -1:, :]
    return read_kap, read_k, rem_kap, rem_k, end * kap_in, end * k_in


def _pairs_segmented(rc: Tensor, remove: Tensor, kc: Tensor, kap: Tensor, wc: Tensor) -> Pairs:
    """Same as :func:`_pairs_factored` from explicit segment products ``D[t, s, i]``.

    Exact for any decays (including 0) at ``O(C^2 Dk)`` elementwise cost per chunk.
    """
    span = segment_products(wc, time_dim=-2)  # D[t, s, i], (B, H, N, C, C, Dk)
    span_prev = F.pad(span[..., :-1, :, :], (0, 0, 0, 0, 1, 0))  # D[t-1, s, i], zero for s >= t
    keys = torch.stack([kap, kc], dim=-1)  # (B, H, N, C_s, Dk, 2)
    rem_kap, rem_k = torch.einsum("...tsi,...sij->...tsj", remove.unsqueeze(-2) * span_prev, keys).unbind(-1)
    read_kap, read_k = torch.einsum("...tsi,...sij->...tsj", rc.unsqueeze(-2) * span, keys).unbind(-1)
    end = span[..., -1, :, :]
    return read_kap, read_k, rem_kap, rem_k, end * kap, end * kc
