"""Floors: the analytic values against Monte Carlo strategies played on generated eval data.

Each strategy reads the sequence in plain Python (it never looks at the targets), emits a
guess per scored position, and is scored against the targets; the empirical rate must match
the task's analytic floor within a few binomial standard errors.
"""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

import tasks
from tasks import floors as fl

IGNORE = -100


def _play(task, strategy, seed=0):
    """Accuracy of ``strategy(seq, position, rng) -> guess`` over the scored positions."""
    rng = random.Random(seed)
    hits = total = 0
    for x, y in task.eval_batches(seed):
        for seq, tgt in zip(x.tolist(), y.tolist()):
            for t, v in enumerate(tgt):
                if v != IGNORE:
                    hits += strategy(seq, t, rng) == v
                    total += 1
    return hits / total, total


def _close(measured, expected, n, sds=4.0):
    se = math.sqrt(expected * (1 - expected) / n)
    return abs(measured - expected) <= sds * se + 1e-12


def test_published_values():
    assert tasks.build("mqar", K=32).floors()["value_marginal"] == pytest.approx(1 / 26)
    assert tasks.build("mqar", K=32).floors()["no_binding"] == pytest.approx(0.0685, abs=5e-4)
    assert tasks.build("mqar", K=8).floors()["table"] == 1 / 8
    assert tasks.build("haystack").floors()["value_marginal"] == pytest.approx(0.0185, abs=1e-4)
    assert tasks.build("collision").floors()["positional"] == pytest.approx(0.264, abs=1e-3)
    assert tasks.build("s5").floors() == {"value_marginal": 1 / 120}


@pytest.mark.parametrize("K", [8, 32])
def test_mqar_floors_by_monte_carlo(K):
    task = tasks.build("mqar", K=K, eval_size=1024)
    floors = task.floors()

    def random_table_value(seq, t, rng):
        return seq[2 * rng.randrange(K) + 1]

    def random_value(seq, t, rng):
        return task.value_offset + rng.randrange(26)

    def random_slot(seq, t, rng):  # table floor: right only when the guessed slot is the queried one
        slot = rng.randrange(K)
        return seq[2 * slot + 1] if seq[2 * slot] == seq[t - 1] else -1

    for strat, key in ((random_table_value, "no_binding"), (random_value, "value_marginal"), (random_slot, "table")):
        acc, n = _play(task, strat)
        assert _close(acc, floors[key], n), (key, acc, floors[key])


@pytest.mark.parametrize("name", ["haystack", "collision"])
def test_haystack_and_collision_floors_by_monte_carlo(name):
    task = tasks.build(name, L=64, dense=4, eval_size=1024)
    floors = task.floors()

    def random_table_position(seq, t, rng):  # positional: the table sits at the start at max gap
        return seq[2 * rng.randrange(4) + 1]

    def random_value(seq, t, rng):
        return task.value_offset + rng.randrange(54)

    acc, n = _play(task, random_table_position)
    assert _close(acc, floors["no_binding"], n)
    if name == "collision":
        assert floors["positional"] == floors["no_binding"]
    acc, n = _play(task, random_value)
    assert _close(acc, floors["value_marginal"], n)
    assert floors["value_marginal"] == pytest.approx(0.019, abs=5e-4)


def test_collision_last_binding_strategy_sits_near_the_value_floor():
    """Reading the *last* binding of the queried key (what an overwriting memory returns) is
    right only when no decoy re-bound it or a decoy repeated the value."""
    task = tasks.build("collision", L=64, eval_size=1024)

    def last_binding(seq, t, rng):
        key = seq[t - 1]
        return [seq[i + 1] for i in range(0, t - 2, 2) if seq[i] == key][-1]

    acc, n = _play(task, last_binding)
    # 27 decoys over 4 keys: P(no decoy on the queried key) = (3/4)^27 ~ 4e-4.
    expected = (3 / 4) ** 27 + (1 - (3 / 4) ** 27) / 54
    assert _close(acc, expected, n)


def test_s5_answer_marginal_is_uniform():
    task = tasks.build("s5", depth=4, score="all", eval_size=4096)
    answers = [v for _, y in task.eval_batches(0) for row in y.tolist() for v in row if v != IGNORE]
    counts = [0] * 120
    for v in answers:
        counts[v] += 1
    assert stats.chisquare(counts).pvalue > 1e-4

    def random_element(seq, t, rng):
        return rng.randrange(120)

    acc, n = _play(task, random_element)
    assert _close(acc, 1 / 120, n)


def test_s5_products_missing_one_generator_score_chance():
    """Composing all generators but the first (a strategy that skips one step) is at 1/120."""
    task = tasks.build("s5", depth=4, eval_size=4096)
    ref = tasks.build("s5", depth=3, eval_size=1)

    def skip_first(seq, t, rng):
        rest = seq[2:t] + [task.mask_token]  # g_2 MASK g_3 MASK g_4 MASK
        return ref.decode(rest)[len(rest) - 1]

    acc, n = _play(task, skip_first)
    assert _close(acc, 1 / 120, n)


@pytest.mark.parametrize("vocab,seq_len", [(80, 512), (96, 256)])
def test_mad_floors_by_monte_carlo(vocab, seq_len):
    task = tasks.build("mad_recall", vocab_size=vocab, seq_len=seq_len, eval_size=2048)
    floors = task.floors()

    def bindings(seq):
        out = {}
        for i in range(0, len(seq) - 2, 2):
            if seq[i] < task.n_keys:
                out.setdefault(seq[i], seq[i + 1])
        return out

    def random_seen_value(seq, t, rng):
        return rng.choice(list(bindings(seq).values()))

    def random_seen_key(seq, t, rng):  # table floor: right only if the guessed key is the probe
        key = rng.choice(list(bindings(seq)))
        return bindings(seq)[key] if key == seq[-1] else -1

    acc, n = _play(task, random_seen_value)
    assert _close(acc, floors["no_binding"], n)
    acc, n = _play(task, random_seen_key)
    assert _close(acc, floors["table"], n)
    assert floors["value_marginal"] == 1 / task.n_values


def test_distinct_key_distribution_against_simulation():
    """The occupancy/binomial recursion against direct simulation of the slot process."""
    n_slots, p, n_keys = 40, 0.3, 7
    dist = fl.distinct_key_distribution(n_slots, p, n_keys)
    assert sum(dist) == pytest.approx(1.0)
    rng = random.Random(0)
    sims = 40_000
    counts = [0] * (n_keys + 1)
    for _ in range(sims):
        m = 1 + sum(rng.random() < p for _ in range(n_slots - 1))
        counts[len({rng.randrange(n_keys) for _ in range(m)})] += 1
    for d in range(n_keys + 1):
        assert abs(counts[d] / sims - dist[d]) < 4 * math.sqrt(dist[d] * (1 - dist[d]) / sims) + 1e-3


@pytest.mark.parametrize("name", ["ar_scaling", "mqar_scaling"])
def test_scaling_floors_by_monte_carlo(name):
    task = tasks.build(name, vocab_size=64, n_facts=8, seq_len=40, eval_size=2048)
    floors = task.floors()
    assert floors["no_binding"] == pytest.approx(1 / 8 + 7 / 8 / 32)

    def random_table_value(seq, t, rng):
        return seq[2 * rng.randrange(8) + 1]

    acc, n = _play(task, random_table_value)
    assert _close(acc, floors["no_binding"], n)
