"""The notebook API; the CLI (``orchestrator analyze``) is a thin layer over it.

Every function takes the database (URL, path or Engine; None means the default
``runs/orchestrator.db``), a sweep name, an optional :class:`AnalysisConfig` and keyword
overrides of its fields::

    from orchestrator import analysis as oa
    trials, evals = oa.load("runs/orchestrator.db", "basin_map")
    oa.lockin(db, "basin_map", by="variant", cells="lr,vocab_size")
    oa.fisher(db, "curriculum", by="curriculum", compare="dense,distance").p_value
    oa.hazard(db, "basin_map", formula="np.log(t) + C(lr) + C(vocab_size) + C(variant)").summary
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
from sqlalchemy.engine import Engine

from orchestrator.errors import UserError

from . import contrasts, survival, tables
from .config import AnalysisConfig
from .data import SweepData, formula_name, load_sweep
from .events import with_events
from .groups import check_params
from .hazard import HazardResult, default_rhs, fit_hazard
from .person_period import person_period
from .results import TestResult

KINDS = ("lockin", "outcomes", "fisher", "permutation", "mcnemar", "km", "logrank", "hazard")

Db = str | Engine | None


@dataclass
class Prepared:
    """A sweep read with a config: the raw data and the trials carrying their events."""

    data: SweepData
    trials: pd.DataFrame
    cfg: AnalysisConfig


def config(cfg: AnalysisConfig | None = None, **overrides: Any) -> AnalysisConfig:
    """``cfg`` (or the defaults) with the non-None ``overrides`` applied."""
    return (cfg or AnalysisConfig()).with_overrides(**overrides)


def prepare(db: Db, sweep: str, cfg: AnalysisConfig | None = None, **overrides: Any) -> Prepared:
    """Load a sweep, check the parameters the config names, attach the events."""
    cfg = config(cfg, **overrides)
    data = load_sweep(db, sweep, where=cfg.where, statuses=cfg.statuses)
    check_params(data.trials, cfg.by, data.params, "--by")
    check_params(data.trials, cfg.cells, data.params, "--cells")
    if cfg.heatmap is not None:
        check_params(data.trials, [cfg.heatmap.x, cfg.heatmap.y]
                     + ([cfg.heatmap.facet] if cfg.heatmap.facet else []), data.params,
                     "heatmap")
    trials = with_events(data.trials, data.evals, cfg)
    if trials.empty:
        raise UserError(f"sweep {sweep!r}: no trials with eval points match (statuses "
                        f"{', '.join(cfg.statuses)}" + (f"; --where {cfg.where!r})" if cfg.where
                                                        else ")"))
    return Prepared(data=data, trials=trials, cfg=cfg)


def hazard_rhs(cfg: AnalysisConfig) -> str:
    return cfg.formula or default_rhs([formula_name(b) for b in cfg.by])


def fit(prep: Prepared, formula: str | None = None, link: str | None = None) -> HazardResult:
    """The hazard fit of a prepared sweep (formula and link default to the config's)."""
    pp = person_period(prep.data.evals, prep.trials)
    return fit_hazard(pp, formula or hazard_rhs(prep.cfg), link or prep.cfg.link)


def run(prep: Prepared, kind: str) -> TestResult | HazardResult | survival.KMResult | pd.DataFrame:
    """One analysis of :data:`KINDS` on a prepared sweep."""
    cfg, trials = prep.cfg, prep.trials
    if kind == "lockin":
        return tables.lockin_table(trials, cfg)
    if kind == "outcomes":
        return tables.outcome_table(trials, cfg)
    if kind == "fisher":
        return contrasts.fisher(trials, cfg)
    if kind == "permutation":
        return contrasts.permutation(trials, cfg)
    if kind == "mcnemar":
        return contrasts.mcnemar(trials, cfg)
    if kind == "km":
        return survival.km(trials, cfg)
    if kind == "logrank":
        return survival.logrank(trials, cfg)
    if kind == "hazard":
        return fit(prep)
    raise UserError(f"unknown analysis {kind!r}; expected one of {', '.join(KINDS)}")


def _one(kind: str):
    def f(db: Db, sweep: str, cfg: AnalysisConfig | None = None, **overrides: Any):
        return run(prepare(db, sweep, cfg, **overrides), kind)

    f.__name__ = kind
    f.__doc__ = f"``{kind}`` of a sweep; see :func:`run` and :class:`AnalysisConfig`."
    return f


lockin = _one("lockin")
outcomes = _one("outcomes")
fisher = _one("fisher")
permutation = _one("permutation")
mcnemar = _one("mcnemar")
km = _one("km")
logrank = _one("logrank")


def hazard(db: Db, sweep: str, formula: str | None = None, link: str | None = None,
           cfg: AnalysisConfig | None = None, **overrides: Any) -> HazardResult:
    """Discrete-time hazard fit straight from the database (load, expand, fit)."""
    return run(prepare(db, sweep, cfg, formula=formula, link=link, **overrides), "hazard")
