"""Two-group contrasts of lock-in and accuracy: Fisher exact, permutation, exact McNemar.

All take trials that carry their events (:func:`.events.with_events`), form groups from
``cfg.by`` and use the two named by ``cfg.compare`` (or the only two). Direction: for a
one-sided ``alternative``, ``greater`` means the first group (A) has the higher lock-in rate
or mean; the p-values come straight from ``scipy.stats``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from orchestrator.errors import UserError

from .config import AnalysisConfig
from .groups import format_value, labels, ordered, pick_two
from .results import TestResult


def _two(trials: pd.DataFrame, cfg: AnalysisConfig, what: str):
    if not cfg.by:
        raise UserError(f"{what} needs --by PARAM to form groups")
    labs = labels(trials, cfg.by)
    a, b = pick_two(ordered(trials, cfg.by), cfg.compare, what)
    return a, b, trials[labs == a], trials[labs == b]


def fisher(trials: pd.DataFrame, cfg: AnalysisConfig) -> TestResult:
    """Fisher exact test on lock-in counts, A vs B; all three alternatives are reported,
    ``p_value`` is the one ``cfg.alternative`` names."""
    from scipy.stats import fisher_exact

    a, b, ta, tb = _two(trials, cfg, "fisher")
    ka, na, kb, nb = int(ta["locked"].sum()), len(ta), int(tb["locked"].sum()), len(tb)
    table = [[ka, na - ka], [kb, nb - kb]]
    ps = {alt: float(fisher_exact(table, alternative=alt).pvalue) for alt in ("two-sided", "greater", "less")}
    odds = fisher_exact(table).statistic
    return TestResult(
        test="fisher",
        p_value=ps[cfg.alternative],
        test_statistic=float(odds),
        groups={
            a: {"k": ka, "n": na, "rate": ka / na if na else None},
            b: {"k": kb, "n": nb, "rate": kb / nb if nb else None},
        },
        details={
            "alternative": cfg.alternative,
            "p_two_sided": ps["two-sided"],
            "p_greater": ps["greater"],
            "p_less": ps["less"],
            "odds_ratio": float(odds),
            "metric": cfg.metric,
            "lockin": cfg.lockin,
        },
    )


def permutation(trials: pd.DataFrame, cfg: AnalysisConfig) -> TestResult:
    """Permutation test of mean(A) - mean(B) of the ``metric`` accuracy. Exact (every
    relabelling) when there are at most ``n_resamples`` of them, else Monte Carlo with
    ``random_seed``."""
    from scipy.stats import permutation_test

    a, b, ta, tb = _two(trials, cfg, "permutation")
    xa = ta["metric_acc"].dropna().to_numpy(dtype=float)
    xb = tb["metric_acc"].dropna().to_numpy(dtype=float)
    if len(xa) < 1 or len(xb) < 1:
        raise UserError(f"permutation: group {a if len(xa) < 1 else b!r} has no accuracies")

    def diff(x, y, axis):
        return np.mean(x, axis=axis) - np.mean(y, axis=axis)

    n_perm = math.comb(len(xa) + len(xb), len(xa))
    res = permutation_test(
        (xa, xb),
        diff,
        permutation_type="independent",
        vectorized=True,
        n_resamples=cfg.n_resamples,
        alternative=cfg.alternative,
        rng=np.random.default_rng(cfg.random_seed),
    )
    return TestResult(
        test="permutation",
        p_value=float(res.pvalue),
        test_statistic=float(res.statistic),
        groups={a: {"n": len(xa), "mean": float(xa.mean())}, b: {"n": len(xb), "mean": float(xb.mean())}},
        details={
            "alternative": cfg.alternative,
            "statistic": "mean(A) - mean(B)",
            "metric": cfg.metric,
            "exact": n_perm <= cfg.n_resamples,
            "n_relabellings": n_perm,
        },
    )


def _pair_keys(part: pd.DataFrame, pair_on: list[str], group: str) -> dict[tuple, bool]:
    out: dict[tuple, bool] = {}
    for rec, locked in zip(part[pair_on].itertuples(index=False, name=None), part["locked"]):
        key = tuple(format_value(v) for v in rec)
        if key in out:
            shown = ", ".join(f"{p}={v}" for p, v in zip(pair_on, key))
            raise UserError(
                f"mcnemar: group {group!r} has several trials with {shown}; add "
                "parameters to --pair-on or narrow --where"
            )
        out[key] = bool(locked)
    return out


def mcnemar(trials: pd.DataFrame, cfg: AnalysisConfig) -> TestResult:
    """Exact McNemar test on pairs matched by ``cfg.pair_on`` (default the seed): the
    discordant pairs are binomial(n, 1/2) under the null. ``test_statistic`` is the number
    of pairs where only A locked in; ``greater`` means A locks in more often."""
    from scipy.stats import binomtest

    a, b, ta, tb = _two(trials, cfg, "mcnemar")
    for p in cfg.pair_on:
        if p not in trials.columns:
            raise UserError(f"--pair-on {p!r}: no such parameter")
    pa, pb = _pair_keys(ta, cfg.pair_on, a), _pair_keys(tb, cfg.pair_on, b)
    common = [k for k in pa if k in pb]
    if not common:
        raise UserError(f"mcnemar: no {'/'.join(cfg.pair_on)} value is shared by groups {a!r} and {b!r}")
    only_a = sum(1 for k in common if pa[k] and not pb[k])
    only_b = sum(1 for k in common if pb[k] and not pa[k])
    n = only_a + only_b
    p_value = float(binomtest(only_a, n, 0.5, alternative=cfg.alternative).pvalue) if n else 1.0
    return TestResult(
        test="mcnemar",
        p_value=p_value,
        test_statistic=float(only_a),
        groups={
            a: {"locked": sum(pa[k] for k in common), "n": len(common)},
            b: {"locked": sum(pb[k] for k in common), "n": len(common)},
        },
        details={
            "alternative": cfg.alternative,
            "n_pairs": len(common),
            "only_a": only_a,
            "only_b": only_b,
            "unpaired": len(pa) + len(pb) - 2 * len(common),
            "pair_on": cfg.pair_on,
            "metric": cfg.metric,
            "lockin": cfg.lockin,
        },
    )
