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

import torch

from kernels.chunking import factorable, from_chunks, segment_products, to_chunks
from kernels.dispatch import check_chunk_size, empty_result, resolve_impl, run_pytorch_form
from kernels.validation import expect_rank, expect_shape

# Measured on 2-core CPUs (T = 256, D = 16..64, batch 8..64, fwd+bwd): 32 is best or within
# a few percent of best; the scalar decay keeps the per-chunk work small.
DEFAULT_CHUNK_SIZE = 32


def ssd_scan_naive(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: one step of the recurrence per loop iteration (see module docstring)."""
    bsz, h, t_len, p = x.shape
    n = b.shape[-1]
    state = x.new_zeros(bsz, h, p, n) if initial_state is None else initial_state
    outs = []
    for t in range(t_len):
        state = a[:, :, t, None, None] * state + x[:, :, t].unsqueeze(-1) * b[:, :, t].unsqueeze(-2)
        outs.append((state @ c[:, :, t].unsqueeze(-1)).squeeze(-1))
    return torch.stack(outs, dim=2), state


def ssd_scan_chunk(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunkwise-parallel form (the SSD block decomposition), exact up to rounding.

    With pairwise decays ``G[t, s] = prod_{s<j<=t} a_j`` inside a chunk and ``g_t =
    prod_{j<=t} a_j``: ``Y = (C B^T * G) X + g * C H0^T`` per chunk, and the chunk maps
    ``H0`` to ``g_C H0 + X^T (G[C, :] * B)``. Because the chunk-to-chunk map is a scalar
    times the state plus a term, the states entering every chunk come from one more
    pairwise-decay matmul over the chunk axis: no sequential loop at all.
    """
    bsz, h, t_len, p = x.shape
    size = min(check_chunk_size(chunk_size), t_len)
    # Padding steps have a = 1 and x = b = 0: the state passes through unchanged.
    xc, bc, cc = to_chunks(x, size, 0.0), to_chunks(b, size, 0.0), to_chunks(c, size, 0.0)
    ac = to_chunks(a, size, 1.0)
    decay = torch.cumprod(ac, dim=-1)  # (B, H, K, C)
    g = decay.unsqueeze(-1)
    if factorable(decay):
        # G[t, s] = g_t / g_s rides on the vectors: the C x C decay matrix is never formed.
        b_in = bc / g
        scores = ((g * cc) @ b_in.transpose(-1, -2)).tril()
        b_end = g[..., -1:, :] * b_in
    else:
        pair = segment_products(ac, time_dim=-1)  # (B, H, K, C, C)
        scores = (cc @ bc.transpose(-1, -2)) * pair
        b_end = pair[..., -1, :].unsqueeze(-1) * bc
    intra = scores @ xc
    inject = xc.transpose(-1, -2) @ b_end  # (B, H, K, P, N)

    chunk_decay = decay[..., -1]  # (B, H, K)
    across = segment_products(chunk_decay, time_dim=-1)  # (B, H, K, K): decay from after m to after k
    after = (across @ inject.flatten(-2)).view_as(inject)  # state after chunk k, from zero
    if initial_state is not None:
        after = after + torch.cumprod(chunk_decay, dim=-1)[..., None, None] * initial_state.unsqueeze(2)
        first = initial_state.unsqueeze(2)
    else:
        first = torch.zeros_like(after[:, :, :1])
    before = torch.cat([first, after[:, :, :-1]], dim=2)
    y = intra + (g * cc) @ before.transpose(-1, -2)
    return from_chunks(y, t_len), after[:, :, -1]


def ssd_scan(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    *,
    impl: str = "auto",
    initial_state: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the SSD scan; returns ``(y (B,H,T,P), final_state (B,H,P,N))``.

    ``H_t = a_t H_{t-1} + x_t b_t^T``, ``y_t = H_t c_t``, inputs used as given. ``impl``:
    "naive", "chunk" or "auto" (always chunk: there is no triton form). The PyTorch forms
    compute in fp32 for 16-bit inputs, return ``y`` in the input dtype and the final state
    in the compute dtype; fp64 stays fp64.
    """
    expect_rank("x", x, 4, "(B, H, T, P)")
    bsz, h, t_len, p = x.shape
    expect_rank("b", b, 4, "(B, H, T, N)")
    n = b.shape[-1]
    dev = x.device
    expect_shape("a", a, (bsz, h, t_len), "(B, H, T)", dev)
    expect_shape("b", b, (bsz, h, t_len, n), "(B, H, T, N)", dev)
    expect_shape("c", c, (bsz, h, t_len, n), "(B, H, T, N)", dev)
    expect_shape("initial_state", initial_state, (bsz, h, p, n), "(B, H, P, N)", dev)
    check_chunk_size(chunk_size)
    form = resolve_impl("ssd_scan", impl, dev)
    if t_len == 0:
        return empty_result(x, (bsz, h, 0, p), (bsz, h, p, n), initial_state)
    if form == "naive":
        return run_pytorch_form(ssd_scan_naive, (x, a, b, c), initial_state)
    return run_pytorch_form(ssd_scan_chunk, (x, a, b, c), initial_state, chunk_size=chunk_size)
