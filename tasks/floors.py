"""Analytic floors (chance levels of strategies that do not bind keys to values).

Names used by every task (Appendix C of the seed paper):

* ``value_marginal`` -- emit a value ignoring the sequence: ``1 / n_values`` when each answer
  is uniform over ``n_values`` tokens (any fixed guess scores the same).
* ``no_binding`` -- emit the value of a uniformly random binding of the context, ignoring which
  key is queried ("emit a random table value"): ``1/K + (K-1)/K * 1/n_values`` for a table of
  ``K`` bindings with values iid uniform (≈0.068 for MQAR at K=32).
* ``table`` -- guess among the ``K`` bindings and be right only on the queried one: ``1/K``.
* ``positional`` -- (collision) emit the value at a random *table position*; numerically the
  no-binding formula over the table (≈0.26 for 4 pairs and 54 values).
"""

from __future__ import annotations

import functools
import math


def value_marginal(n_values: int) -> float:
    return 1.0 / n_values


def random_table_value(k: int, n_values: int) -> float:
    """P(correct) when emitting the value of a uniformly random slot of a ``k``-slot table whose
    values are iid uniform over ``n_values``: the queried slot (1/k) or a coincidence."""
    return 1.0 / k + (k - 1) / k / n_values


def table(k: int) -> float:
    return 1.0 / k


@functools.lru_cache(maxsize=64)
def distinct_key_distribution(n_slots: int, p_pair: float, n_keys: int) -> tuple[float, ...]:
    """Distribution of ``D``, the number of distinct keys in a MAD noisy-recall context.

    The context has ``n_slots`` slots; one (forced) slot is a key-value pair and each other is
    a pair with probability ``p_pair``, so ``M = 1 + Binomial(n_slots - 1, p_pair)`` pairs,
    each with a key uniform over ``n_keys``. Returns ``P(D = d)`` for ``d = 0..n_keys`` by
    summing the occupancy recursion ``P(d | m) = P(d | m-1) d/n + P(d-1 | m-1) (n-d+1)/n``
    over the binomial weights.
    """
    n = n_keys
    occ = [0.0] * (n + 1)
    occ[0] = 1.0  # m = 0 pairs
    out = [0.0] * (n + 1)
    trials = n_slots - 1
    log_p = math.log(p_pair) if p_pair > 0 else -math.inf
    log_q = math.log1p(-p_pair) if p_pair < 1 else -math.inf
    for m in range(1, n_slots + 1):
        nxt = [0.0] * (n + 1)
        for d in range(1, n + 1):
            nxt[d] = occ[d] * d / n + occ[d - 1] * (n - d + 1) / n
        occ = nxt
        j = m - 1  # successes among the non-forced slots
        if p_pair in (0.0, 1.0):
            w = 1.0 if (j == 0 and p_pair == 0.0) or (j == trials and p_pair == 1.0) else 0.0
        else:
            w = math.exp(
                math.lgamma(trials + 1)
                - math.lgamma(j + 1)
                - math.lgamma(trials - j + 1)
                + j * log_p
                + (trials - j) * log_q
            )
        for d in range(n + 1):
            out[d] += w * occ[d]
    return tuple(out)


def expected_over_distinct_keys(n_slots: int, p_pair: float, n_keys: int, f) -> float:
    """``E[f(D)]`` under :func:`distinct_key_distribution` (``D >= 1`` always)."""
    dist = distinct_key_distribution(n_slots, p_pair, n_keys)
    return sum(p * f(d) for d, p in enumerate(dist) if d >= 1 and p > 0)
