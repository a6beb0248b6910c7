"""A sweep through an analysis: read it (:func:`prepare`: load, check the named parameters,
attach the events), run one analysis of the table (:func:`run`), wrap the result
(:func:`result`). The notebook API, the CLI (``orchestrator analyze``), the report and the
dashboard all go this way.

Every notebook function takes the database (URL, path or Engine; None means the default
``runs/orchestrator.db``), a sweep name, an optional :class:`AnalysisConfig` and keyword
overrides of its fields::

    from orchestrator import analysis as oa
    trials, evals = oa.load_sweep("runs/orchestrator.db", "basin_map")
    oa.lockin(db, "basin_map", by="variant", cells="lr,vocab_size")  # cells: the strata
    oa.fisher(db, "curriculum", by="curriculum", compare="dense,distance").p_value
    oa.hazard(db, "basin_map", formula="np.log(t) + C(lr) + C(vocab_size) + C(variant)").summary
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
from sqlalchemy.engine import Engine

from orchestrator.errors import UserError

from .analyses import ANALYSES, KINDS, hazard_rhs
from .config import AnalysisConfig
from .data import SweepData, load_sweep
from .events import events, n_stopped
from .groups import check_params
from .hazard import HazardResult, fit_hazard
from .person_period import person_period
from .results import TableResult

Db = str | Engine | None


@dataclass
class Prepared:
    """A sweep read with a config: the data (its eval rows those the analysis reads under
    ``cfg.diverged``, see :mod:`.diverged`) and the trials carrying their events."""

    data: SweepData
    trials: pd.DataFrame
    cfg: AnalysisConfig


def config(cfg: AnalysisConfig | None = None, **overrides: Any) -> AnalysisConfig:
    """``cfg`` (or the defaults) with the non-None ``overrides`` applied."""
    return (cfg or AnalysisConfig()).with_overrides(**overrides)


def prepare(
    db: Db,
    sweep: str,
    cfg: AnalysisConfig | None = None,
    *,
    evals: pd.DataFrame | Callable[[], pd.DataFrame] | None = None,
    known_params: Mapping[int, Mapping[str, Any]] | None = None,
    **overrides: Any,
) -> Prepared:
    """Load a sweep, check the parameters the config names, attach the events (the traces
    cut at ``cfg.horizon``, read under ``cfg.diverged``, ``cfg.stopped_as`` applied).
    ``evals``: the sweep's eval frame read already (:func:`~.data.read_evals`), shared by
    several preparations of one sweep, or a function that gives it once the trials are read
    (:func:`~.data.load_sweep`). ``known_params``: trial id -> params decoded already
    (the dashboard's trial table holds them)."""
    cfg = config(cfg, **overrides)
    data = load_sweep(db, sweep, where=cfg.where, statuses=cfg.statuses, evals=evals, known_params=known_params)
    check_params(data.trials, cfg.by, data.params, "--by")
    check_params(data.trials, cfg.strata, data.params, "--strata")
    if cfg.heatmap is not None:
        check_params(
            data.trials,
            [cfg.heatmap.x, cfg.heatmap.y] + ([cfg.heatmap.facet] if cfg.heatmap.facet else []),
            data.params,
            "heatmap",
        )
    # The one event rule (orchestrator/events.py): horizon, diverged, stopped-as.
    rows, trials = events(data.trials, data.evals, cfg)
    data = replace(data, evals=rows)
    if trials.empty:
        raise UserError(
            f"sweep {sweep!r}: no trials with eval points match (statuses "
            f"{', '.join(cfg.statuses)}"
            + (f"; --where {cfg.where!r}" if cfg.where else "")
            + (f"; at or before the horizon, step {cfg.horizon})" if cfg.horizon else ")")
        )
    return Prepared(data=data, trials=trials, cfg=cfg)


def fit(prep: Prepared, formula: str | None = None, link: str | None = None) -> HazardResult:
    """The hazard fit of a prepared sweep (formula and link default to the config's)."""
    pp = person_period(prep.data.evals, prep.trials)
    return fit_hazard(pp, formula or hazard_rhs(prep.cfg), link or prep.cfg.link)


# Analyses of the state at the budget (lock-in, outcome classes, final accuracy): undefined
# for trials the stop rule ended early.
AT_BUDGET = ("lockin", "outcomes", "fisher", "permutation", "mcnemar", "scaling")


def run(prep: Prepared, kind: str) -> Any:
    """One analysis of :data:`KINDS` (the rows of :data:`ANALYSES`) on a prepared sweep."""
    a = ANALYSES.get(kind)
    if a is None:
        raise UserError(f"unknown analysis {kind!r}; expected one of {', '.join(KINDS)}")
    if kind in AT_BUDGET and prep.cfg.stopped_as is None and n_stopped(prep.trials):
        raise UserError(
            f"{n_stopped(prep.trials)} trial(s) were ended by the spec's stop rule after their "
            f"escape, so their lock-in at budget and final accuracy are unknown: pass "
            f"--stopped-as solved to count them as solved, or use km/logrank/hazard (escape "
            f"times are unaffected)"
        )
    if a.reads == "sweep":
        return a.fn(prep.data, prep.cfg, None)
    return a.fn(prep.trials, prep.cfg, prep.data.evals)


def result(kind: str, res: Any) -> Any:
    """``res`` with ``.summary`` and ``.to_dict()``: table-shaped results are wrapped in a
    :class:`TableResult` (the report and the CLI use :func:`run`'s bare frames)."""
    return TableResult(kind, res) if isinstance(res, pd.DataFrame) else res


def _one(kind: str):
    def f(db: Db, sweep: str, cfg: AnalysisConfig | None = None, **overrides: Any):
        return result(kind, run(prepare(db, sweep, cfg, **overrides), kind))

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


def hazard(
    db: Db,
    sweep: str,
    formula: str | None = None,
    link: str | None = None,
    cfg: AnalysisConfig | None = None,
    **overrides: Any,
) -> HazardResult:
    """Discrete-time hazard fit straight from the database (load, expand, fit)."""
    return run(prepare(db, sweep, cfg, formula=formula, link=link, **overrides), "hazard")
