"""Kaplan-Meier curves and log-rank tests on escape times (lifelines).

Durations are the trials' ``time`` in training steps (escape step, else the collapse
step, else the divergence step under ``diverged: censor``, else the last eval step) and the
event is the escape; collapse censors and is reported separately per group as the
competing risk it is (count and median step), as are the trials censored at divergence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from orchestrator.errors import UserError

from .config import AnalysisConfig
from .groups import labels, ordered, pick_two, strata_iter
from .results import TestResult, jsonable


def _group_figures(part: pd.DataFrame) -> dict[str, Any]:
    col = part["collapse_step"].dropna()
    return {
        "n": int(len(part)),
        "escapes": int(part["event"].sum()),
        "collapses": int((part["end"] == "collapse").sum()),
        "censored_at_budget": int((part["end"] == "budget").sum()),
        "censored_at_divergence": int((part["end"] == "diverged").sum()),
        "median_collapse_step": float(col.median()) if len(col) else None,
    }


@dataclass
class KMResult:
    """Kaplan-Meier fit per group. ``groups[g]`` has n, escapes, collapses,
    censored_at_budget, censored_at_divergence, ``median`` (KM median escape step, None when not reached) and
    ``survival`` ([step, S(step)] pairs, S = fraction not yet escaped)."""

    groups: dict[str, dict[str, Any]]
    fitters: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def summary(self) -> pd.DataFrame:
        return pd.DataFrame.from_dict(
            {g: {k: v for k, v in d.items() if k != "survival"} for g, d in self.groups.items()}, orient="index"
        )

    def to_dict(self) -> dict[str, Any]:
        return jsonable({"test": "km", "groups": self.groups})


def km_median(sf: pd.Series) -> float | None:
    """Median escape step: the first step where the survival curve is at or below 0.5
    (None when it never gets there). Written out because lifelines' own median flips to
    the next step when floating point leaves the curve a hair above 0.5."""
    hit = sf.index[sf.to_numpy() <= 0.5 + 1e-9]
    return float(hit[0]) if len(hit) else None


def km(trials: pd.DataFrame, cfg: AnalysisConfig) -> KMResult:
    from lifelines import KaplanMeierFitter

    labs = labels(trials, cfg.by)
    groups, fitters = {}, {}
    for g in ordered(trials, cfg.by):
        part = trials[labs == g]
        kmf = KaplanMeierFitter(label=g)
        kmf.fit(part["time"].to_numpy(dtype=float), part["event"].to_numpy(dtype=int))
        sf = kmf.survival_function_.iloc[:, 0]
        groups[g] = {
            **_group_figures(part),
            "median": km_median(sf),
            "survival": [[float(t), float(s)] for t, s in sf.items()],
        }
        fitters[g] = kmf
    return KMResult(groups=groups, fitters=fitters)


def logrank(trials: pd.DataFrame, cfg: AnalysisConfig) -> TestResult:
    """Two-group log-rank (``cfg.compare``, or when there are exactly two groups) with the
    variance ``cfg.logrank`` names (:func:`orchestrator.design.stats.logrank_test`, the test the
    sequential looks decide with), else lifelines' multi-group log-rank over every group. The
    variance used is in ``details["variance"]``."""
    from lifelines.statistics import multivariate_logrank_test

    from orchestrator.design.stats import logrank_test

    if not cfg.by:
        raise UserError("logrank needs --by PARAM to form groups")
    labs = labels(trials, cfg.by)
    avail = ordered(trials, cfg.by)
    if cfg.compare or len(avail) == 2:
        a, b = pick_two(avail, cfg.compare, "logrank")
        ta, tb = trials[labs == a], trials[labs == b]
        # The design's own test (a sequential look calls the same function on the same events).
        res = logrank_test(
            ta["time"].to_numpy(float),
            ta["event"].to_numpy(bool),
            tb["time"].to_numpy(float),
            tb["event"].to_numpy(bool),
            method=cfg.logrank,
        )
        return TestResult(
            test="logrank",
            p_value=res.p,
            test_statistic=res.chi2,
            groups={a: _group_figures(ta), b: _group_figures(tb)},
            details={"kind": "two-group", "degrees_of_freedom": 1, "variance": res.method, "z": res.z},
        )
    if len(avail) < 2:
        raise UserError(f"logrank needs at least two groups, found {len(avail)}")
    multi = multivariate_logrank_test(trials["time"].to_numpy(float), labs.to_numpy(), trials["event"].to_numpy(int))
    groups = {g: _group_figures(trials[labs == g]) for g in avail}
    return TestResult(
        test="logrank",
        p_value=float(multi.p_value),
        test_statistic=float(multi.test_statistic),
        groups=groups,
        # lifelines' multi-group test: the textbook variance, whatever --logrank says.
        details={"kind": "multi-group", "degrees_of_freedom": len(groups) - 1, "variance": "hypergeometric"},
    )


def logrank_strata(
    trials: pd.DataFrame, cfg: AnalysisConfig, strata: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Log-rank within each stratum (``cfg.strata`` unless ``strata`` is given); strata with
    fewer than two groups or no escape are listed with ``p_value`` None and the reason. Each
    entry's stratum is under the key ``cell`` (the JSON's name)."""
    out = []
    for stratum, sub in strata_iter(trials, list(cfg.strata if strata is None else strata)):
        groups = ordered(sub, cfg.by)
        entry: dict[str, Any] = {"cell": stratum}
        if cfg.compare and not all(g in groups for g in cfg.compare):
            entry.update(p_value=None, reason="a compared group is missing here")
        elif len(groups) < 2:
            entry.update(p_value=None, reason="fewer than two groups")
        elif int(sub["event"].sum()) == 0:
            entry.update(
                p_value=None,
                reason="no escapes",
                groups={g: _group_figures(sub[labels(sub, cfg.by) == g]) for g in groups},
            )
        else:
            entry.update(logrank(sub, cfg).to_dict())
        out.append(entry)
    return out
