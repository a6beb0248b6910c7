"""Discrete-time hazard models: a binomial GLM on the person-period frame.

``event ~ <rhs>`` is fitted with statsmodels' formula API (patsy), logit link by default or
complementary log-log (whose exp(coef) is a grouped-time proportional-hazards ratio; under
the logit link exp(coef) is an odds ratio of the per-interval hazard, which is what the
scaffold study reports as HR). The right-hand side may name any trial parameter (full
dotted name through ``Q("task.vocab_size")``, or its aliases), ``t`` and ``k`` of the
interval, and numpy as ``np``: ``np.log(t) + C(lr) + C(vocab_size) * C(variant)``,
``np.log(t) + np.log(lr) + I(2*np.log(lr) - np.log(batch_size))``.
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from orchestrator.errors import UserError

LINKS = ("logit", "cloglog")
TERM_COLUMNS = ("coef", "se", "hr", "ci_low", "ci_high", "z", "p")


def default_rhs(by: list[str]) -> str:
    """``np.log(t)`` plus one categorical term per grouping parameter."""
    return " + ".join(["np.log(t)"] + [f"C({b})" for b in by])


def normalise_formula(formula: str) -> str:
    """Accept a right-hand side (``np.log(t) + C(lr)``) or a full ``event ~ ...`` formula."""
    f = formula.strip()
    if not f:
        raise UserError("--formula is empty; expected a right-hand side such as 'np.log(t) + C(lr)'")
    if "~" in f:
        lhs, rhs = f.split("~", 1)
        if lhs.strip() != "event":
            raise UserError(
                f"--formula {formula!r}: the left-hand side must be 'event' (or give only the right-hand side)"
            )
        f = rhs.strip()
    return f"event ~ {f}"


@dataclass
class HazardResult:
    """A fitted hazard model. ``summary`` has one row per term (index: patsy's term name)
    and columns coef, se, hr = exp(coef), ci_low/ci_high (95% Wald CI of hr), z, p."""

    formula: str
    link: str
    n_intervals: int
    n_events: int
    n_trials: int
    summary: pd.DataFrame
    converged: bool
    loglik: float
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        terms = [
            {"term": str(term), **{c: _num(row[c]) for c in TERM_COLUMNS}} for term, row in self.summary.iterrows()
        ]
        return {
            "formula": self.formula,
            "link": self.link,
            "n_intervals": self.n_intervals,
            "n_events": self.n_events,
            "n_trials": self.n_trials,
            "converged": self.converged,
            "loglik": _num(self.loglik),
            "warnings": list(self.warnings),
            "terms": terms,
        }


def _num(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def family(link: str):
    import statsmodels.api as sm

    if link == "logit":
        return sm.families.Binomial(link=sm.families.links.Logit())
    if link == "cloglog":
        return sm.families.Binomial(link=sm.families.links.CLogLog())
    raise UserError(f"--link {link!r}: expected one of {', '.join(LINKS)}")


# patsy's stateful transforms learn from the rows they see (means, quantiles): on collapsed
# rows they would learn something else, so formulas using them are fitted row by row.
_STATEFUL = re.compile(r"\b(center|standardize|scale|bs|cr|cc|te)\s*\(")


def formula_columns(full: str, columns) -> list[str] | None:
    """The frame columns a formula's right-hand side reads (bare names and ``Q("...")``),
    or None when that cannot be known for sure (parse failure, stateful transforms)."""
    try:
        from patsy import ModelDesc

        desc = ModelDesc.from_formula(full)
        codes = [f.code for term in desc.rhs_termlist for f in term.factors]
    except Exception:
        return None
    cols = set(columns)
    used: set[str] = set()
    for code in codes:
        if _STATEFUL.search(code):
            return None
        try:
            tree = ast.parse(code, mode="eval")
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in cols:
                used.add(node.id)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Q"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and node.args[0].value in cols
            ):
                used.add(node.args[0].value)
    return sorted(used)


def collapse_rows(pp: pd.DataFrame, used: list[str]) -> tuple[pd.DataFrame, int]:
    """Identical (covariates, event) rows merged into one with a ``_n`` count, and how many
    rows were dropped for a missing covariate (what patsy would drop)."""
    sub = pp[[*used, "event"]]
    n0 = len(sub)
    if used:
        sub = sub.dropna(subset=used)
    grouped = sub.groupby([*used, "event"], sort=True, dropna=False, observed=True).size()
    return grouped.reset_index(name="_n"), n0 - len(sub)


def _glm(formula: str, data: pd.DataFrame, fam, **kw):
    import statsmodels.formula.api as smf

    # eval_env=0: the formula sees this module's namespace (numpy as ``np``) behind the data.
    return smf.glm(formula, data=data, family=fam, eval_env=0, **kw)


def _refuse_collinear(model, formula: str) -> None:
    """A rank-deficient design has no unique coefficients: IRLS would return whichever the
    pseudo-inverse's cut-off picks, which differs between BLAS builds. Name the columns that
    add nothing to the ones before them (in the formula's order) instead."""
    exog = np.asarray(model.exog, dtype=float)
    if np.linalg.matrix_rank(exog) == exog.shape[1]:
        return
    names = model.exog_names
    redundant, rank = [], 0
    for j in range(exog.shape[1]):
        r = np.linalg.matrix_rank(exog[:, : j + 1])
        if r == rank:
            redundant.append(names[j])
        rank = r
    raise UserError(
        f"hazard fit {formula!r}: the design is collinear ({exog.shape[1]} columns, rank {rank}): "
        f"{', '.join(redundant)} {'is a combination' if len(redundant) == 1 else 'are combinations'} "
        "of earlier terms (a covariate constant in this data, or an empty cell): drop or change it"
    )


def fit_hazard(pp: pd.DataFrame, formula: str, link: str = "logit", collapse: bool = True) -> HazardResult:
    """Fit ``formula`` (right-hand side or ``event ~ ...``) on a person-period frame.

    With ``collapse`` the rows that share every covariate the formula reads and the event
    are merged and fitted with frequency weights: the binomial likelihood, and so every
    coefficient, standard error and the log-likelihood, is that of the row-by-row fit
    (tested), at a fraction of the cost (tens of thousands of intervals become hundreds)."""
    full = normalise_formula(formula)
    fam = family(link)
    if pp.empty:
        raise UserError("no run-intervals to fit: every trial has fewer than two evals, or --where kept none")
    n_events = int(pp["event"].sum())
    if n_events == 0:
        raise UserError(
            f"no escapes among {len(pp)} run-intervals: nothing to fit (lower --escape-at or check --where)"
        )
    used = formula_columns(full, pp.columns) if collapse else None
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as wlist:
        warnings.simplefilter("always")
        try:
            if used is not None:
                data, dropped = collapse_rows(pp, used)
                if dropped:
                    notes.append(f"{dropped} run-intervals dropped for a missing covariate")
                model = _glm(full, data, fam, freq_weights=data["_n"].to_numpy(dtype=float))
            else:
                model = _glm(full, pp, fam)
        except Exception as exc:  # patsy errors: unknown names, bad syntax
            msg = " ".join(str(exc).split("\n")[0].split())
            raise UserError(f"--formula {formula!r}: {msg}") from None
        _refuse_collinear(model, full)
        try:
            # Tight IRLS tolerance: cheap on collapsed rows, and fits agree to 1e-9.
            res = model.fit(tol=1e-12, maxiter=200)
        except Exception as exc:  # singular design, perfect separation
            raise UserError(f"hazard fit {full!r} failed: {str(exc).splitlines()[0]}") from None
        notes += sorted({str(w.message).splitlines()[0] for w in wlist})
    ci = res.conf_int(alpha=0.05)
    with np.errstate(over="ignore"):  # a separated term's exp(coef) is inf, shown as such
        summary = pd.DataFrame(
            {
                "coef": res.params,
                "se": res.bse,
                "hr": np.exp(res.params),
                "ci_low": np.exp(ci.iloc[:, 0]),
                "ci_high": np.exp(ci.iloc[:, 1]),
                "z": res.tvalues,
                "p": res.pvalues,
            }
        )
    summary.index.name = "term"
    # A group with no escapes (or only escapes) drives its coefficient towards infinity:
    # IRLS stops at a huge coefficient with a huge SE. Say so instead of printing a CI.
    separated = [t for t, r in summary.iterrows() if t != "Intercept" and (not np.isfinite(r["se"]) or r["se"] > 50)]
    if separated:
        notes.append(
            "(quasi-)complete separation, hazard ratio not identifiable for: " + ", ".join(map(str, separated))
        )
    n_used = int(model.freq_weights.sum()) if used is not None else int(res.nobs)
    n_ev = int(np.sum(model.endog * model.freq_weights)) if used is not None else n_events
    converged = bool(getattr(res, "converged", True))
    return HazardResult(
        formula=full,
        link=link,
        n_intervals=n_used,
        n_events=n_ev,
        n_trials=int(pp["trial_id"].nunique()),
        summary=summary,
        converged=converged,
        loglik=float(res.llf),
        warnings=notes,
    )
