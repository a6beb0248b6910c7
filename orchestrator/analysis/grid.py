"""A sweep as a grid: one cell per combination of some parameters' values (the dashboard's
heatmap, the studies' basin map and batch x LR tables), each with its trial count and a
rate with its exact 95% interval.

``lockin``: ``k`` of ``n`` trials locked in (the lock-in of :mod:`.events`, the numbers
``orchestrator analyze lockin --by AXES`` prints: the same :func:`.tables.lockin_table`).
``escape_median``: ``k`` of ``n`` trials escaped, and the Kaplan-Meier median escape step
(:func:`.tables.km_median_escape`, the figure of the outcome tables). The interval is
Clopper-Pearson's (scipy's ``binomtest(...).proportion_ci(method="exact")``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from orchestrator.errors import UserError

from .config import AnalysisConfig
from .groups import check_params, format_value, labels, ordered
from .tables import _cp_interval, km_median_escape, lockin_table

METRICS = ("lockin", "escape_median")
CELL_COLUMNS = ("label", "n", "k", "rate", "ci_low", "ci_high", "median", "trial_ids")


def grid_cells(
    trials: pd.DataFrame, cfg: AnalysisConfig, axes: Sequence[str], metric: str = "lockin", params: Sequence[str] = ()
) -> pd.DataFrame:
    """One row per combination of ``axes`` values present (in value order): the axes'
    values (formatted as the analysis labels them), ``label`` (the values joined by ``/``,
    the ``--by`` group label), ``n``, ``k``, ``rate``, ``ci_low``, ``ci_high``, ``median``
    (the median escape step, ``escape_median`` only) and the cell's ``trial_ids``."""
    if metric not in METRICS:
        raise UserError(f"metric {metric!r}: expected one of {', '.join(METRICS)}")
    axes = list(axes)
    if len(set(axes)) != len(axes):
        raise UserError(f"axes {', '.join(axes)}: each parameter may be used once")
    check_params(trials, axes, params, "axis")
    labs = labels(trials, axes)
    if metric == "lockin":
        table = lockin_table(trials, cfg.with_overrides(by=axes), strata=[]).set_index("group")
    rows = []
    for lab in ordered(trials, axes):
        part = trials[labs == lab]
        first = part.iloc[0]
        values = {a: format_value(first[a]) for a in axes}
        if metric == "lockin":
            t = table.loc[lab]
            k, n, rate, lo, hi, med = int(t["k"]), int(t["n"]), float(t["rate"]), t["ci_low"], t["ci_high"], None
        else:
            k, n = int(part["event"].sum()), int(len(part))
            lo, hi = _cp_interval(k, n)
            rate = k / n
            m = km_median_escape(part["time"], part["event"])
            med = None if m != m else m
        ids = [int(i) for i in part["trial_id"]]
        rows.append({**values, "label": lab, "n": n, "k": k, "rate": rate, "ci_low": lo, "ci_high": hi,
                     "median": med, "trial_ids": ids})  # fmt: skip
    return pd.DataFrame(rows, columns=[*axes, *CELL_COLUMNS])


def axis_values(cells: pd.DataFrame, trials: pd.DataFrame, axis: str) -> list[str]:
    """The values of ``axis`` in the grid, in value order (the heatmap's ticks)."""
    present = set(cells[axis])
    return [v for v in ordered(trials, [axis]) if v in present]
