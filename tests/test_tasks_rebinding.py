"""The rebinding control: the derangement's guarantees, the rebound eval sets, and what the
control is for (a genuine retriever collapses, a value-salience heuristic does not)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import tasks
from tasks.derangement import check_derangement, derange, random_multiset_rows
from tasks.mqar import MQAR
from tasks.selftest import derangement_check, run_selftest, task_check

IGNORE = -100


@pytest.mark.parametrize("k,n_symbols", [(2, 26), (4, 54), (8, 3), (16, 26), (32, 26), (33, 2), (5, 1)])
def test_derangement_guarantees(k, n_symbols):
    gen = torch.Generator().manual_seed(k)
    vals = random_multiset_rows(500, k, n_symbols, gen)
    sigma, feasible = derange(vals, gen, n_symbols=n_symbols)
    assert check_derangement(vals, sigma, feasible) == []
    for b in range(500):
        row, s = vals[b].tolist(), sigma[b].tolist()
        assert sorted(s) == list(range(k))  # a bijection
        counts = Counter(row)
        assert bool(feasible[b]) == (k >= 2 and 2 * max(counts.values()) <= k)
        if feasible[b]:
            assert all(s[i] != i for i in range(k))  # no fixed point
            assert all(row[s[i]] != row[i] for i in range(k))  # every answer changed


def test_derangement_with_validity_mask():
    gen = torch.Generator().manual_seed(3)
    vals = random_multiset_rows(400, 12, 6, gen)
    valid = torch.rand(vals.shape, generator=gen) < 0.6
    sigma, feasible = derange(vals, gen, valid=valid, n_symbols=6)
    assert check_derangement(vals, sigma, feasible, valid) == []
    assert (sigma[~valid] == torch.arange(12).expand(400, 12)[~valid]).all()


def test_derangement_is_random_not_a_fixed_shift():
    vals = torch.arange(6).expand(2000, 6)  # distinct values: every derangement is admissible
    sigma, feasible = derange(vals, torch.Generator().manual_seed(0), n_symbols=6)
    assert feasible.all()
    assert len({tuple(r) for r in sigma.tolist()}) > 100


def test_the_checker_catches_broken_derangements():
    vals = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    feasible = torch.tensor([True, True])
    ident = torch.arange(4).expand(2, 4)
    assert any("fixed point" in p for p in check_derangement(vals, ident, feasible))
    swap_equal = torch.tensor([[1, 0, 3, 2], [1, 0, 3, 2]])  # row 1 swaps equal values
    assert any("unchanged" in p for p in check_derangement(vals, swap_equal, feasible))
    not_bijection = torch.tensor([[1, 1, 3, 2], [2, 3, 0, 1]])
    assert any("bijection" in p for p in check_derangement(vals, not_bijection, feasible))
    assert check_derangement(vals, torch.tensor([[1, 2, 3, 0], [2, 3, 0, 1]]), feasible) == []


def test_rebinding_not_applicable_to_s5():
    assert tasks.build("s5").rebinding_batches(0) is None


@pytest.mark.parametrize(
    "name,params",
    [
        ("mqar", {"K": 8}),
        ("mqar", {"K": 32}),
        ("haystack", {"L": 64, "dense": 4}),
        ("collision", {"L": 64}),
        ("mad_recall", {"seq_len": 128}),
        ("ar_scaling", {"vocab_size": 256, "n_facts": 8, "seq_len": 32}),
        ("mqar_scaling", {"vocab_size": 256, "n_facts": 8, "seq_len": 48}),
    ],
)
def test_rebinding_sets(name, params):
    task = tasks.build(name, **params, eval_size=300)
    check = task_check(task, name)
    assert check.ok, check.detail
    a, b = task.rebinding_batches(4), task.rebinding_batches(4)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)  # fixed per seed
    originals = task.eval_batches(4)
    for (x0, y0), (x1, y1) in zip(originals, a):
        assert x0.shape == x1.shape
        scored = y1 != IGNORE
        assert torch.equal(y1[scored], y0[scored])  # the ORIGINAL values are the targets
        assert (x0 != x1).any(dim=1).all()  # every sequence was rebound
        lo, hi = task.value_range
        assert ((x0 == x1) | ((x0 >= lo) & (x0 < hi))).all()  # only value tokens moved


def test_infeasible_rows_are_left_unscored():
    task = tasks.build("mqar", K=2, n_values=2, eval_size=512)
    n_unscored = 0
    for (x0, y0), (x1, y1) in zip(task.eval_batches(0), task.rebinding_batches(0)):
        for b in range(x0.shape[0]):
            vals = task.table_values(x0[b].tolist())
            if vals[0] == vals[1]:  # no derangement can change both answers
                assert (y1[b] == IGNORE).all()
                n_unscored += 1
            else:
                assert (y1[b] != IGNORE).sum() == 2
    assert 150 < n_unscored < 360  # about half of the rows


def test_control_separates_a_retriever_from_a_value_salience_heuristic():
    """An exact retriever (the reference decoder) is perfect on the eval set and scores 0 on the
    rebound set; 'emit the most frequent table value' scores identically on both."""
    task = tasks.build("mqar", K=16, eval_size=512)

    def score(batches, strategy):
        hits = total = 0
        for x, y in batches:
            for seq, tgt in zip(x.tolist(), y.tolist()):
                for t, v in enumerate(tgt):
                    if v != IGNORE:
                        hits += strategy(seq, t) == v
                        total += 1
        return hits / total

    def retriever(seq, t):
        return task.decode(seq)[t]

    def salience(seq, t):
        counts = Counter(task.table_values(seq))
        return max(sorted(counts), key=lambda v: counts[v])

    evals, rebound = task.eval_batches(0), task.rebinding_batches(0)
    assert score(evals, retriever) == 1.0
    assert score(rebound, retriever) == 0.0
    s_eval, s_rebound = score(evals, salience), score(rebound, salience)
    assert s_eval == s_rebound and s_eval > task.floors()["value_marginal"]


def test_task_check_detects_a_broken_control():
    class NoDerange(MQAR):
        def _derange(self, comp, gen):
            return comp, torch.ones(comp["values"].shape[0], dtype=torch.bool)

    broken = NoDerange(MQAR.Config(K=8, eval_size=64))
    check = task_check(broken, "broken")
    assert not check.ok and ("fixed point" in check.detail or "unchanged" in check.detail)


def test_full_selftest_passes():
    checks = run_selftest(eval_size=64)
    assert checks[0].name == "derangement construction" and checks[0].ok
    assert len(checks) >= 15 and all(c.ok for c in checks), [c for c in checks if not c.ok]
    assert derangement_check(seed=5, rows=400).ok
