"""Tables over trials that carry their events (:func:`.events.with_events`): lock-in rates
and outcome classes per group, optionally per stratum."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .config import AnalysisConfig
from .events import OUTCOMES
from .groups import strata_groups


def _cp_interval(k: int, n: int) -> tuple[float, float]:
    """Exact (Clopper-Pearson) 95% interval of a proportion."""
    from scipy.stats import binomtest

    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return float(ci.low), float(ci.high)


def km_median_escape(time, event) -> float:
    """The median escape step, the one definition every table and figure uses: the
    Kaplan-Meier median, i.e. the first eval step at which the product-limit estimate of
    "not yet escaped" is at or below 0.5 (trials that never escape count as censored at
    their last step). NaN when fewer than half escape. It is always an eval step (the
    plain median of the escaped trials' steps could fall between two evals)."""
    t = np.asarray(time, dtype=float)
    e = np.asarray(event, dtype=bool)
    s = 1.0
    for step in np.unique(t[e]):
        at_risk = int((t >= step).sum())
        s *= 1.0 - int(((t == step) & e).sum()) / at_risk
        if s <= 0.5 + 1e-9:
            return float(step)
    return float("nan")


def lockin_table(trials: pd.DataFrame, cfg: AnalysisConfig, strata: Sequence[str] | None = None) -> pd.DataFrame:
    """Per stratum and group: ``k`` of ``n`` trials locked in (``metric`` accuracy >= lockin),
    the rate and its exact 95% interval, and the mean of the metric."""
    strata = list(cfg.strata if strata is None else strata)
    rows = []
    for stratum, g, part in strata_groups(trials, strata, cfg.by):
        k, n = int(part["locked"].sum()), int(len(part))
        lo, hi = _cp_interval(k, n)
        rows.append(
            {
                **stratum,
                "group": g,
                "k": k,
                "n": n,
                "rate": k / n if n else np.nan,
                "ci_low": lo,
                "ci_high": hi,
                "mean_acc": float(part["metric_acc"].mean()),
            }
        )
    return pd.DataFrame(rows, columns=[*strata, "group", "k", "n", "rate", "ci_low", "ci_high", "mean_acc"])


def outcome_table(trials: pd.DataFrame, cfg: AnalysisConfig, strata: Sequence[str] | None = None) -> pd.DataFrame:
    """Per stratum and group: counts of solved / mid / flat / dead, ``n``, the escapes and
    collapses, and the Kaplan-Meier median escape step (:func:`km_median_escape`, the same
    figure the KM table shows)."""
    strata = list(cfg.strata if strata is None else strata)
    rows = []
    for stratum, g, part in strata_groups(trials, strata, cfg.by):
        counts = part["outcome"].value_counts()
        rows.append(
            {
                **stratum,
                "group": g,
                **{o: int(counts.get(o, 0)) for o in OUTCOMES},
                "n": int(len(part)),
                "escapes": int(part["event"].sum()),
                "collapses": int(part["collapse_step"].notna().sum()),
                "median_escape": km_median_escape(part["time"], part["event"]),
            }
        )
    return pd.DataFrame(rows, columns=[*strata, "group", *OUTCOMES, "n", "escapes", "collapses", "median_escape"])


def format_cell(row) -> str:
    """``solved/mid/flat/dead (n) @median`` as the paper's cell table prints a cell."""
    med = row["median_escape"]
    at = "-" if med != med else f"{med:g}"
    return f"{row['solved']}/{row['mid']}/{row['flat']}/{row['dead']} ({row['n']}) @{at}"
