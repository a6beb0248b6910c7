"""The table of analyses: ``{name: Analysis(function, result type, formatter)}``.

The API (:func:`orchestrator.analysis.pipeline.run`), the CLI (``orchestrator analyze KIND``)
and the report's contrasts all read this table, so a new statistic is its own module plus
one row here. A row's function takes the trials (carrying their events), the config and the
sweep's eval rows (only trace-level analyses such as the hazard fit use them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from . import contrasts, multiplicity, scaling, survival, tables
from .config import AnalysisConfig
from .data import formula_name
from .hazard import HazardResult, default_rhs, fit_hazard
from .person_period import person_period
from .results import TestResult


@dataclass(frozen=True)
class Analysis:
    fn: Callable[[pd.DataFrame, AnalysisConfig, pd.DataFrame | None], Any]
    result: type
    format: Callable[[Any], str]
    summary: str
    # "trials": fn(trials with events, cfg, evals); "sweep": fn(SweepData, cfg, None), for
    # analyses of what the sweep stored beside its trials (the sequential looks).
    reads: str = "trials"


# ---- formatters (plain text of ``orchestrator analyze``) -------------------------------------
def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def format_frame(res: pd.DataFrame) -> str:
    return res.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def format_km(res: survival.KMResult) -> str:
    return "Kaplan-Meier on escape times (collapse censors)\n" + res.summary.to_string(
        float_format=lambda v: f"{v:.4g}"
    )


def format_hazard(res: HazardResult) -> str:
    head = (
        f"{res.formula} ({res.link} link): {res.n_intervals} run-intervals, "
        f"{res.n_events} escapes, {res.n_trials} trials" + ("" if res.converged else " [NOT CONVERGED]")
    )
    body = res.summary.to_string(float_format=lambda v: f"{v:.4g}")
    warn = ("\nwarnings: " + "; ".join(res.warnings)) if res.warnings else ""
    return f"{head}\n{body}{warn}"


def format_test(res: TestResult) -> str:
    lines = [
        f"{res.test}: p = {res.p_value:.4g}"
        + (f", statistic = {res.test_statistic:.4g}" if res.test_statistic is not None else "")
    ]
    for g, d in res.groups.items():
        lines.append(f"  {g}: " + ", ".join(f"{k}={_short(v)}" for k, v in d.items()))
    for k, v in res.details.items():
        lines.append(f"  {k}: {_short(v)}")
    return "\n".join(lines)


def format_strata(res: list[dict[str, Any]]) -> str:
    """Per-stratum log-rank (``logrank`` with strata); adjusted p-values where the entries
    carry them (:func:`.multiplicity.annotate`), the raw beside."""
    out = []
    for e in res:
        stratum = " ".join(f"{k}={v}" for k, v in e["cell"].items()) or "all"
        p = e.get("p_value")
        out.append(
            f"{stratum}: "
            + (
                f"{multiplicity.p_text(e)}, chi2 = {e['test_statistic']:.3g}"
                if p is not None
                else f"- ({e.get('reason')})"
            )
        )
    return "\n".join(out)


def sequential_looks(data: Any) -> list[dict[str, Any]]:
    """The stored looks of a ``sequential:`` sweep (one dict per look and stratum)."""
    if not data.looks:
        from orchestrator.errors import UserError

        raise UserError(
            f"sweep {data.sweep!r} has no sequential looks (no `sequential:` block, or no look finished yet)"
        )
    return list(data.looks)


def _sequential(data: Any, cfg: AnalysisConfig, evals: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    return sequential_looks(data)


def format_looks(looks: list[dict[str, Any]]) -> str:
    from orchestrator.design.sequential import LookRecord, format_records

    recs = [LookRecord(**d) for d in looks]
    saved = sum(r.seeds_saved for r in recs)
    decided = [r for r in recs if r.stopped]
    tail = [
        f"{'stratum ' + str(r.stratum) + ': ' if r.stratum else ''}{r.decision} at look "
        f"{r.look}, {r.seeds_saved} seed(s) saved"
        for r in decided
    ]
    return "\n".join([format_records(recs)] + tail + [f"seeds saved in all: {saved}"])


# ---- the table ------------------------------------------------------------------------------
def hazard_rhs(cfg: AnalysisConfig) -> str:
    return cfg.formula or default_rhs([formula_name(b) for b in cfg.by])


def _hazard(trials: pd.DataFrame, cfg: AnalysisConfig, evals: pd.DataFrame | None) -> HazardResult:
    if evals is None:
        raise ValueError("the hazard fit needs the sweep's eval rows")
    return fit_hazard(person_period(evals, trials), hazard_rhs(cfg), cfg.link)


def _on_trials(
    f: Callable[[pd.DataFrame, AnalysisConfig], Any],
) -> Callable[[pd.DataFrame, AnalysisConfig, pd.DataFrame | None], Any]:
    def run(trials: pd.DataFrame, cfg: AnalysisConfig, evals: pd.DataFrame | None = None) -> Any:
        return f(trials, cfg)

    return run


ANALYSES: dict[str, Analysis] = {
    "lockin": Analysis(
        _on_trials(tables.lockin_table), pd.DataFrame, format_frame, "lock-in rate per group and stratum"
    ),
    "outcomes": Analysis(
        _on_trials(tables.outcome_table),
        pd.DataFrame,
        format_frame,
        "solved / mid / collapsed counts per group and stratum",
    ),
    "fisher": Analysis(
        _on_trials(contrasts.fisher), TestResult, format_test, "Fisher exact test on lock-in, two groups"
    ),
    "permutation": Analysis(
        _on_trials(contrasts.permutation), TestResult, format_test, "permutation test of mean accuracy, two groups"
    ),
    "mcnemar": Analysis(
        _on_trials(contrasts.mcnemar), TestResult, format_test, "exact McNemar on lock-in, paired groups"
    ),
    "km": Analysis(_on_trials(survival.km), survival.KMResult, format_km, "Kaplan-Meier of escape times"),
    "logrank": Analysis(
        _on_trials(survival.logrank), TestResult, format_test, "log-rank test of escape times, two groups"
    ),
    "hazard": Analysis(_hazard, HazardResult, format_hazard, "discrete-time hazard fit (person-period GLM)"),
    "sequential": Analysis(
        _sequential,
        list,
        format_looks,
        "group-sequential looks: n per group, statistic, alpha spent, boundary, decision, seeds saved",
        reads="sweep",
    ),
    "scaling": Analysis(
        _on_trials(scaling.analyze),
        scaling.ScalingResult,
        scaling.ScalingResult.text,
        "recall scaling law: accuracy vs N*D/Nf per V",
    ),
}
KINDS: tuple[str, ...] = tuple(ANALYSES)


def format_result(kind: str, res: Any) -> str:
    a = ANALYSES.get(kind)
    if a is not None and a.reads == "sweep":
        return a.format(res)
    if isinstance(res, list):
        return format_strata(res)
    if a is not None and isinstance(res, a.result):
        return a.format(res)
    return str(res)


def to_json(res: Any) -> Any:
    return res if hasattr(res, "shape") or isinstance(res, list) else res.to_dict()
