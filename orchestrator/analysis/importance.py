"""Parameter importance: how much of an outcome's variation across a sweep's trials each
swept parameter accounts for, by optuna's fANOVA evaluator (``optuna.importance``, a random
forest fitted by scikit-learn, then the functional ANOVA decomposition of its prediction).

It reads the frame every other analysis reads (:func:`.pipeline.prepare`: the trials with
their events), so "final accuracy", "lock-in" and "escape step" are the events' own columns.
The trials become a finished optuna study: one ``FrozenTrial`` per trial, its swept
parameters under the distributions :func:`distributions` picks, its value the outcome.
Nothing here is hand-rolled; the numbers are optuna's for that study.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from orchestrator.errors import UserError

from .groups import distinct_rows

SEED = 0
METHOD = f"fANOVA (optuna.importance, seed {SEED})"
# Past FANOVA_MAX_TRIALS trials, optuna's fANOVA (its tree walk is Python: 15 s for 1,000
# trials on a loaded 2-core machine, 40 s for 10,000) gives way to the random forest's own
# importance, optuna's MeanDecreaseImpurityImportanceEvaluator (2 s for 10,000), named so.
FANOVA_MAX_TRIALS = 1000
MDI_METHOD = f"random-forest mean decrease in impurity (optuna.importance, seed {SEED})"
# Outcome name -> (events column, what the page and the CLI call it).
OUTCOMES: dict[str, tuple[str, str]] = {
    "lockin": ("locked", "lock-in (0/1)"),
    "final_acc": ("final_acc", "final accuracy"),
    "escape_step": ("time", "escape step (a trial that never escaped counts at its last eval)"),
}
# A numeric parameter with at most this many values is a set of levels (a grid's lr or
# batch size), not a range: categorical, so the forest assumes no order or spacing.
FEW_VALUES = 3
# Past this many trials even the impurity importance takes tens of seconds.
MAX_TRIALS = 20_000


@dataclass
class Importance:
    """Importances of the swept parameters for one outcome (they sum to 1), largest first."""

    outcome: str
    outcome_label: str
    method: str
    n_trials: int
    importances: dict[str, float]
    kinds: dict[str, str]  # parameter -> "categorical" | "int" | "float" | "float (log)"
    note: str | None = None
    dropped: int = 0  # trials without a finite outcome, left out
    stopped: int = 0  # of those, trials the stop rule ended: their state at the budget is unknown
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "outcome_label": self.outcome_label,
            "method": self.method,
            "n_trials": self.n_trials,
            "dropped": self.dropped,
            "stopped": self.stopped,
            "note": self.note,
            "params": [{"param": p, "importance": v, "kind": self.kinds.get(p)} for p, v in self.importances.items()],
        }

    def summary(self) -> str:
        head = f"parameter importance for {self.outcome_label}: {self.method}, {self.n_trials} trials"
        if self.dropped:
            why = f", {self.stopped} of them ended by the stop rule" if self.stopped else ""
            head += f" ({self.dropped} without a known outcome left out{why})"
        if self.note:
            return f"{head}\n  {self.note}"
        width = max([len(p) for p in self.importances] + [9])
        rows = [f"  {p:<{width}}  {v:.4f}  ({self.kinds.get(p)})" for p, v in self.importances.items()]
        return "\n".join([head, *rows])


def _choice(v: Any) -> Any:
    """A value as an optuna categorical choice (None, bool, int, float or str)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        if isinstance(v, float) and math.isnan(v):
            return None
        return v
    return json.dumps(v, sort_keys=True, default=str)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def swept(trials: pd.DataFrame, params: list[str]) -> list[str]:
    """The parameters of ``params`` that take more than one value among ``trials``."""
    out = []
    for p in params:
        # Each distinct value (type kept apart) encoded once: 100,000 trials share a few.
        if p in trials and len({json.dumps(_choice(v), default=str) for v in distinct_rows(trials[[p]])[p]}) > 1:
            out.append(p)
    return out


def distributions(trials: pd.DataFrame, names: list[str]) -> dict[str, Any]:
    """optuna distributions of the named parameters: categorical for strings, booleans,
    structures, missing values and numbers with at most :data:`FEW_VALUES` levels; else an
    ``IntDistribution`` (whole numbers) or a ``FloatDistribution`` (log-scaled where every
    value is positive and they span a factor of 100 or more)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for p in names:
        values = [_choice(v) for v in trials[p]]
        levels = sorted(set(values), key=lambda v: (type(v).__name__, str(v)))
        if all(_is_number(v) for v in values) and len(levels) > FEW_VALUES:
            lo, hi = min(values), max(values)
            if all(float(v).is_integer() for v in values):
                out[p] = IntDistribution(int(lo), int(hi))
            else:
                out[p] = FloatDistribution(float(lo), float(hi), log=lo > 0 and hi / lo >= 100)
        else:
            out[p] = CategoricalDistribution(levels)
    return out


def _kind(d: Any) -> str:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(d, CategoricalDistribution):
        return "categorical"
    if isinstance(d, IntDistribution):
        return "int"
    return "float (log)" if d.log else "float"


def study_of(trials: pd.DataFrame, names: list[str], values: pd.Series) -> Any:
    """A finished optuna study of ``trials``: one complete trial each, its ``names``
    parameters as set, its value ``values`` (rows with a non-finite value left out)."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    keep = [v is not None and math.isfinite(float(v)) for v in values]
    trials, values = trials[keep], [float(v) for v, k in zip(values, keep) if k]
    dists = distributions(trials, names)
    columns = {}
    for p in names:
        cast = None if isinstance(dists[p], CategoricalDistribution) else int if _kind(dists[p]) == "int" else float
        columns[p] = [_choice(v) if cast is None else cast(v) for v in trials[p]]
    frozen = [
        optuna.trial.create_trial(params={p: columns[p][i] for p in names}, distributions=dists, value=value)
        for i, value in enumerate(values)
    ]
    study = optuna.create_study(direction="maximize")
    study.add_trials(frozen)
    return study


def importance(
    trials: pd.DataFrame,
    params: list[str],
    outcome: str = "final_acc",
    stopped_as: str | None = None,
    fanova_max: int = FANOVA_MAX_TRIALS,
) -> Importance:
    """fANOVA importances (:data:`METHOD`; past ``fanova_max`` trials :data:`MDI_METHOD`) of
    the swept ``params`` for ``outcome`` (one of :data:`OUTCOMES`) over ``trials``, the frame
    :func:`.pipeline.prepare` returns. A trial
    the stop rule ended has no final accuracy, nor a lock-in unless ``stopped_as`` is
    ``solved`` (the events then count it locked in): it is left out of those, as the
    analyses of the state at the budget refuse it (``pipeline.AT_BUDGET``)."""
    from optuna.importance import (
        FanovaImportanceEvaluator,
        MeanDecreaseImpurityImportanceEvaluator,
        get_param_importances,
    )

    if outcome not in OUTCOMES:
        raise UserError(f"outcome {outcome!r}: expected one of {', '.join(OUTCOMES)}")
    column, label = OUTCOMES[outcome]
    if len(trials) > MAX_TRIALS:
        raise UserError(
            f"{len(trials):,} trials, more than the {MAX_TRIALS:,} the importance view fits a forest to; "
            "narrow with where="
        )
    values = pd.to_numeric(trials[column].astype(float), errors="coerce")
    unknown = outcome == "final_acc" or (outcome == "lockin" and stopped_as != "solved")
    stopped = trials["stopped_at"].notna().to_numpy() if unknown and "stopped_at" in trials else None
    if stopped is not None:
        values = values.mask(stopped)
    finite = values.map(lambda v: math.isfinite(v))
    names = swept(trials[finite.to_numpy()], params)
    base: dict[str, Any] = {
        "outcome": outcome,
        "outcome_label": label,
        "method": METHOD if int(finite.sum()) <= fanova_max else MDI_METHOD,
        "dropped": int((~finite).sum()),
        "stopped": int(stopped.sum()) if stopped is not None else 0,
    }
    n = int(finite.sum())
    if not names:
        return Importance(**base, n_trials=n, importances={}, kinds={}, note="no parameter varies among these trials")
    if n < 2 or values[finite].nunique() < 2:
        return Importance(
            **base,
            n_trials=n,
            importances={},
            kinds={},
            note=f"the {label} is the same in every trial: nothing for a parameter to explain",
        )
    study = study_of(trials, names, values)
    kinds = {p: _kind(d) for p, d in study.trials[0].distributions.items()}
    fanova = base["method"] == METHOD
    evaluator = FanovaImportanceEvaluator(seed=SEED) if fanova else MeanDecreaseImpurityImportanceEvaluator(seed=SEED)
    # Sorted: optuna 5.0's impurity evaluator pairs its sorted search space's importances with
    # the names in the order given, so any other order mislabels them (fANOVA does not).
    got = get_param_importances(study, evaluator=evaluator, params=sorted(names), normalize=True)
    return Importance(**base, n_trials=n, importances={p: float(v) for p, v in got.items()}, kinds=kinds)
