"""The rebinding control's derangement: move every binding's value to another slot.

Given the values bound in one sequence's table (a multiset), the control re-pairs keys with
values by a permutation ``sigma`` of the table slots such that

* ``sigma`` is a bijection on the valid slots (the multiset of table values is unchanged, so a
  value-salience heuristic such as "emit the most frequent table value" scores exactly what it
  scored before),
* ``sigma(i) != i`` (no fixed point), and
* ``values[sigma(i)] != values[i]`` for every slot (every answer changes, so a genuine
  retriever, which emits the rebound value, scores 0 against the original value).

Construction, vectorised per row: order the valid slots by a random rank of their value, ties
broken at random, so equal values form contiguous runs; with ``m`` the longest run and ``n``
the number of valid slots, shift that order cyclically by a random ``s`` in ``[m, n - m]``.
A slot and its image are then never in the same run, which needs ``n >= 2m``; rows where a
value fills more than half the table admit no value-changing derangement and are reported
as infeasible (the caller leaves them unscored).
"""

from __future__ import annotations

from typing import Any

import torch

from tasks.sampling import rand, randint


def derange(
    values: torch.Tensor, gen: torch.Generator, valid: torch.Tensor | None = None, n_symbols: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(sigma, feasible)`` for ``values`` of shape ``(B, K)`` (int64, non-negative).

    ``sigma`` (``(B, K)`` int64): rebound value of slot ``i`` is ``values[b, sigma[b, i]]``;
    invalid slots (``valid`` False) map to themselves and are never used as sources.
    ``feasible`` (``(B,)`` bool): the row has ``n >= 2`` valid slots and no value on more than
    half of them, i.e. every guarantee in the module docstring holds for that row.
    ``n_symbols``: an upper bound on the values (defaults to ``values.max() + 1``).
    """
    bsz, k = values.shape
    dev = values.device
    if valid is None:
        valid = torch.ones_like(values, dtype=torch.bool)
    if n_symbols is None:
        n_symbols = int(values.max().item()) + 1 if values.numel() else 1
    # A random relabelling of the symbols makes the run order (hence sigma) random, not sorted.
    relabel = rand((bsz, n_symbols), gen).argsort(dim=1)
    rank = relabel.gather(1, values.clamp_min(0)).to(torch.float64)
    tiebreak = rand((bsz, k), gen).to(torch.float64)
    key = torch.where(valid, rank + tiebreak, torch.full_like(rank, float("inf")))
    order = key.argsort(dim=1)  # valid slots first, grouped by value
    n = valid.sum(dim=1)
    sorted_vals = values.gather(1, order)
    pos = torch.arange(k, device=dev).expand(bsz, k)
    in_range = pos < n.unsqueeze(1)
    # Longest run of equal values among the valid prefix.
    same = torch.zeros((bsz, k), dtype=torch.bool, device=dev)
    if k > 1:
        same[:, 1:] = (sorted_vals[:, 1:] == sorted_vals[:, :-1]) & in_range[:, 1:]
    run_start = torch.where(~same, pos, torch.zeros_like(pos))
    run_start = run_start.cummax(dim=1).values
    run_len = torch.where(in_range, pos - run_start + 1, torch.zeros_like(pos))
    m = run_len.max(dim=1).values.clamp_min(1)
    feasible = (n >= 2) & (n >= 2 * m)
    # Random shift s in [m, n - m]; infeasible rows still get a bijection (shift by m or 1).
    span = (n - 2 * m + 1).clamp_min(1)
    s = m + (rand((bsz,), gen) * span.to(torch.float32)).long().clamp_max(span - 1)
    n_safe = n.clamp_min(1)
    src_pos = torch.where(in_range, (pos + s.unsqueeze(1)) % n_safe.unsqueeze(1), pos)
    # Slot order[j] takes the value of slot order[src_pos[j]].
    sigma = torch.arange(k, device=dev).expand(bsz, k).clone()
    sigma.scatter_(1, order, order.gather(1, src_pos))
    return sigma, feasible


def derange_component(
    comp: dict[str, Any], key: str, gen: torch.Generator, n_symbols: int, valid: torch.Tensor | None = None
) -> tuple[dict[str, Any], torch.Tensor]:
    """A task's components with the ``(B, K)`` values under ``key`` deranged along each row
    (:func:`derange`), and the rows' ``feasible`` mask: what a task's ``_derange`` returns."""
    sigma, feasible = derange(comp[key], gen, valid=valid, n_symbols=n_symbols)
    return {**comp, key: comp[key].gather(1, sigma)}, feasible


def check_derangement(
    values: torch.Tensor, sigma: torch.Tensor, feasible: torch.Tensor, valid: torch.Tensor | None = None
) -> list[str]:
    """Slow, independent check of :func:`derange`'s guarantees; returns failure lines (empty = ok).

    Loops in Python over rows so it shares no code path with the vectorised construction.
    """
    problems: list[str] = []
    vals = values.tolist()
    sig = sigma.tolist()
    feas = feasible.tolist()
    ok = valid.tolist() if valid is not None else [[True] * values.shape[1]] * values.shape[0]
    for b, (row, srow, okrow) in enumerate(zip(vals, sig, ok)):
        slots = [i for i, v in enumerate(okrow) if v]
        images = [srow[i] for i in slots]
        if sorted(images) != slots:
            problems.append(f"row {b}: sigma is not a bijection on the table slots")
        if any(srow[i] != i for i, v in enumerate(okrow) if not v):
            problems.append(f"row {b}: an invalid slot was moved")
        counts: dict[int, int] = {}
        for i in slots:
            counts[row[i]] = counts.get(row[i], 0) + 1
        expect_feasible = len(slots) >= 2 and 2 * max(counts.values(), default=0) <= len(slots)
        if feas[b] != expect_feasible:
            problems.append(f"row {b}: feasible={feas[b]} but the multiset says {expect_feasible}")
        if feas[b]:
            if any(srow[i] == i for i in slots):
                problems.append(f"row {b}: sigma has a fixed point")
            if any(row[srow[i]] == row[i] for i in slots):
                problems.append(f"row {b}: some answer is unchanged")
    return problems


def random_multiset_rows(batch: int, k: int, n_symbols: int, gen: torch.Generator) -> torch.Tensor:
    """``(batch, k)`` values with heavy repetition, to stress :func:`derange` in the self-test."""
    width = randint(n_symbols, (batch, 1), gen).clamp_min(1)
    return (rand((batch, k), gen) * width).long()
