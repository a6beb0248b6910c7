"""The rebinding control's self-test (``orchestrator tasks selftest``).

Two layers, both checked by code independent of the construction:

1. :func:`tasks.derangement.derange` on adversarial multisets (heavy repetition, partial
   validity masks, rows where no value-changing derangement exists): a bijection on the valid
   slots, no fixed point, every value changed, infeasible rows flagged exactly.
2. Every task with the control, at its published settings: decoding each rebound eval sequence
   with the task's reference decoder (``Task.decode``), the table's value multiset is unchanged
   (a bijection), no table slot keeps its value (no fixed point), every scored answer differs
   from the original target (every answer changed), and nothing but table values moved.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from tasks.base import IGNORE, Task
from tasks.derangement import check_derangement, derange, random_multiset_rows
from tasks.published import PUBLISHED
from tasks.registry import build
from tasks.sampling import rand


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def derangement_check(seed: int = 0, rows: int = 2000) -> Check:
    gen = torch.Generator().manual_seed(seed)
    problems: list[str] = []
    infeasible = total = 0
    for k in (1, 2, 3, 4, 5, 8, 16, 32, 33):
        for n_symbols in (1, 2, 3, 26, 54):
            vals = random_multiset_rows(rows // 20, k, n_symbols, gen)
            for valid in (None, rand(vals.shape, gen) < 0.7):
                sigma, feasible = derange(vals, gen, valid=valid, n_symbols=n_symbols)
                problems += [f"K={k} symbols={n_symbols}: {p}" for p in check_derangement(vals, sigma, feasible, valid)]
                infeasible += int((~feasible).sum())
                total += feasible.numel()
    detail = (
        f"{total} adversarial rows, {infeasible} correctly flagged infeasible"
        if not problems
        else "; ".join(problems[:5])
    )
    return Check("derangement construction", not problems, detail)


def task_check(task: Task, label: str, seed: int = 0) -> Check:
    originals = task.eval_batches(seed)
    rebound = task.rebinding_batches(seed)
    assert rebound is not None, f"{label}: no rebinding control to check"  # callers pass has_rebinding tasks
    problems: list[str] = []
    scored = unscored_rows = 0
    for (x0, y0), (x1, y1) in zip(originals, rebound):
        moved = x0 != x1
        for b in range(x0.shape[0]):
            s0, s1 = x0[b].tolist(), x1[b].tolist()
            if not bool((y1[b] != IGNORE).any()):
                unscored_rows += 1
                continue
            v0, v1 = task.table_values(s0), task.table_values(s1)
            if Counter(v0) != Counter(v1):
                problems.append(f"row {b}: table values are not a permutation of the original")
            if any(a == c for a, c in zip(v0, v1)):
                problems.append(f"row {b}: a table slot kept its value (fixed point)")
            answers = task.decode(s1)
            for t in (y1[b] != IGNORE).nonzero().flatten().tolist():
                scored += 1
                if answers[t] == int(y1[b, t]):
                    problems.append(f"row {b} position {t}: answer unchanged")
                if int(y1[b, t]) != int(y0[b, t]):
                    problems.append(f"row {b} position {t}: target is not the original value")
            if _moved_outside_values(task, s0, moved[b]):
                problems.append(f"row {b}: a token other than a table value moved")
        if len(problems) > 20:
            break
    detail = (
        f"{scored} scored answers all changed, {unscored_rows} infeasible rows unscored"
        if not problems
        else "; ".join(problems[:5])
    )
    return Check(f"rebinding {label}", not problems, detail)


def _moved_outside_values(task: Task, seq: list[int], moved: torch.Tensor) -> bool:
    """Only value tokens (the token right after a key's binding) may differ."""
    lo, hi = task.value_range
    return any(m and not lo <= seq[t] < hi for t, m in enumerate(moved.tolist()))


def run_selftest(seed: int = 0, eval_size: int = 256) -> list[Check]:
    """All checks; ``eval_size`` sequences per published setting (kept small: it is a CLI)."""
    checks = [derangement_check(seed)]
    for name, params in PUBLISHED:
        task = build(name, **{**params, "eval_size": eval_size})
        if not task.has_rebinding:
            continue
        if task.seq_len > 1024:  # the Python decoder is the bottleneck; shorter forms suffice
            continue
        label = name + "(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
        checks.append(task_check(task, label, seed))
    return checks
