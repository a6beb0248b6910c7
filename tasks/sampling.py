"""Vectorised sampling primitives shared by the task generators.

Every function draws from the given ``torch.Generator`` and creates its tensors on that
generator's device, so a batch is a pure function of the generator state (determinism per
seed) and needs no host round trip beyond what is stated.
"""

from __future__ import annotations

import math

import torch


def randint(high: int, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Uniform int64 in ``[0, high)`` of ``shape`` on ``gen.device``."""
    return torch.randint(0, high, shape, generator=gen, device=gen.device)


def rand(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Uniform float32 in ``[0, 1)`` of ``shape`` on ``gen.device``."""
    return torch.rand(shape, generator=gen, device=gen.device)


def sample_distinct(batch: int, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """``(batch, k)`` int64: per row, ``k`` distinct values of ``range(n)`` in uniformly random order.

    Each row is a uniformly random ordered ``k``-subset, by one of these exact methods, chosen
    by cost (scaling-law vocabularies reach 50K, so ``O(n)`` per row is avoided when possible):

    * ``n <= 1024``: the ``k`` largest of ``n`` iid uniforms, ranked (no loop, no host sync);
    * ``k*k <= n``: iid rows, rejected row-wise until a row has no repeat (acceptance >= ~0.6);
    * ``k`` well below ``n``: the first ``k`` distinct values of ``m`` iid draws (``m`` about
      the coupon-collector count plus margin; rows with fewer than ``k`` distinct are redrawn);
    * otherwise the ``k`` largest of ``n`` iid uniforms, ranked.

    The rejection methods are exact because the ordered tuple of first occurrences of an iid sequence is
    a uniform ordered subset, and the events conditioned on are invariant under relabelling.
    """
    if not 0 <= k <= n:
        raise ValueError(f"cannot draw {k} distinct values from range({n})")
    if k == 0 or batch == 0:
        return torch.empty((batch, k), dtype=torch.long, device=gen.device)
    if n <= _SMALL_N:
        return rand((batch, n), gen).topk(k, dim=1).indices
    if k * k <= n:
        return _redraw_rows(batch, k, gen, lambda rows: _iid_without_repeats(rows, n, k, gen))
    draws = _draws_for_distinct(n, k)
    if 4 * draws <= n:
        return _redraw_rows(batch, k, gen, lambda rows: _first_distinct(rows, n, k, draws, gen))
    return rand((batch, n), gen).topk(k, dim=1).indices


_SMALL_N = 1024


def _draws_for_distinct(n: int, k: int) -> int:
    """Draws that give ``k`` distinct of ``n`` with high probability (mean + 4 sd + slack)."""
    mean = n * math.log(n / (n - k)) if k < n else math.inf
    return int(mean + 4 * math.sqrt(mean) + 8) if math.isfinite(mean) else n * n


def _redraw_rows(batch: int, k: int, gen: torch.Generator, draw) -> torch.Tensor:
    """Call ``draw(rows) -> (values (rows, k), ok (rows,))`` and redraw failed rows until none fail."""
    out, ok = draw(batch)
    while not bool(ok.all()):
        idx = (~ok).nonzero().squeeze(1)
        vals, ok_new = draw(idx.numel())
        out[idx] = vals
        ok = ok.clone()
        ok[idx] = ok_new
    return out


def _iid_without_repeats(rows: int, n: int, k: int, gen: torch.Generator):
    vals = randint(n, (rows, k), gen)
    return vals, ~_rows_with_repeats(vals)


def _first_distinct(rows: int, n: int, k: int, m: int, gen: torch.Generator):
    cand = randint(n, (rows, m), gen)
    sorted_vals, idx = cand.sort(dim=1, stable=True)
    first_sorted = torch.ones_like(sorted_vals, dtype=torch.bool)
    first_sorted[:, 1:] = sorted_vals[:, 1:] != sorted_vals[:, :-1]
    is_first = torch.zeros_like(first_sorted).scatter_(1, idx, first_sorted)
    rank = is_first.cumsum(dim=1)
    ok = rank[:, -1] >= k
    out = torch.zeros((rows, k), dtype=torch.long, device=cand.device)
    sel = is_first & (rank <= k) & ok.unsqueeze(1)
    out[ok] = cand[sel].view(-1, k)
    return out, ok


def _rows_with_repeats(x: torch.Tensor) -> torch.Tensor:
    """``(B,)`` bool: whether row ``b`` of ``x`` holds some value twice."""
    if x.shape[1] < 2:
        return torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    s = x.sort(dim=1).values
    return (s[:, 1:] == s[:, :-1]).any(dim=1)


def random_permutation(batch: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """``(batch, k)`` int64: an independent uniformly random permutation of ``range(k)`` per row."""
    return rand((batch, k), gen).argsort(dim=1)


def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(B, n), (B, n) -> (B, 2n)`` as ``a0 b0 a1 b1 ...``."""
    return torch.stack((a, b), dim=2).reshape(a.shape[0], -1)
