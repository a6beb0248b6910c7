"""Discrete-time hazard fits: known ratios recovered from data simulated with them, the
fit straight from the store equal to statsmodels called directly on intervals the test
builds itself, the collapsed-rows fit equal to the row-by-row fit, and CI coverage."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf

from orchestrator import analysis as oa
from orchestrator.analysis.config import AnalysisConfig
from orchestrator.analysis.events import trial_events
from orchestrator.analysis.hazard import fit_hazard, formula_columns
from orchestrator.store.import_jsonl import write_records
from orchestrator.analysis.person_period import expand
from orchestrator.errors import UserError
from orchestrator.store.engine import open_store_engine

GRID = [1] + list(range(200, 3001, 200))
TRUE = {"a": -2.6, "t": 0.6, "lr": np.log(2.0), "ns5": np.log(4.0)}


def hazard_of(eta: float, link: str) -> float:
    return 1 / (1 + np.exp(-eta)) if link == "logit" else 1 - np.exp(-np.exp(eta))


def simulate(rng, n_per_cell: int, link: str, collapse_p: float = 0.02):
    """Trials on the 1, 200, ..., 3000 grid. Per interval: escape with the model's hazard,
    else collapse with ``collapse_p`` (accuracy 0 from that eval on: censored there).
    Returns import records and the at-risk intervals as the simulation saw them."""
    records, intervals = [], []
    for variant in ("baseline", "ns5"):
        for lr in (1e-3, 3e-3):
            for seed in range(n_per_cell):
                eta0 = TRUE["a"] + TRUE["lr"] * (lr == 3e-3) + TRUE["ns5"] * (variant == "ns5")
                accs, state = [0.02], "plateau"
                for s in GRID[1:]:
                    if state == "plateau":
                        h = hazard_of(eta0 + TRUE["t"] * np.log(s / 1000), link)
                        ev = rng.random() < h
                        intervals.append({"t": s, "event": int(ev), "lr": lr, "variant": variant})
                        if ev:
                            state = "escaped"
                        elif rng.random() < collapse_p:
                            state = "dead"
                    accs.append({"plateau": 0.02, "escaped": 0.93, "dead": 0.0}[state])
                records.append(
                    {
                        "params": {
                            "arm": "mlstm",
                            "seed": seed,
                            "lr": lr,
                            "batch_size": 16,
                            "tag": {"variant": variant},
                            "task": {"vocab_size": 80},
                        },
                        "trace": [{"step": s, "acc": a, "loss": 1.0} for s, a in zip(GRID, accs)],
                    }
                )
    return records, pd.DataFrame(intervals)


FORMULA = "np.log(t) + C(lr) + C(variant)"
TERMS = {"C(lr)[T.0.003]": TRUE["lr"], "C(variant)[T.ns5]": TRUE["ns5"], "np.log(t)": TRUE["t"]}


@pytest.mark.parametrize("link", ["logit", "cloglog"])
def test_hazard_from_the_store_recovers_known_ratios_and_matches_statsmodels(db_url, link):
    # Seeds fixed; the coverage test below checks these intervals over many draws.
    rng = np.random.default_rng({"logit": 5, "cloglog": 7}[link])
    records, intervals = simulate(rng, 60, link)
    engine, _ = open_store_engine(db_url)
    write_records(engine, "sim", records)
    res = oa.hazard(engine, "sim", formula=FORMULA, link=link)
    d = res.to_dict()
    assert d["n_intervals"] == len(intervals)
    assert d["n_events"] == int(intervals["event"].sum())
    assert d["n_trials"] == 240
    terms = {t["term"]: t for t in d["terms"]}
    assert set(terms) == {"Intercept", *TERMS}
    for name, true_coef in TERMS.items():
        t = terms[name]
        assert t["ci_low"] < np.exp(true_coef) < t["ci_high"], (name, t)
        assert t["hr"] == pytest.approx(np.exp(t["coef"]))
        assert t["z"] == pytest.approx(t["coef"] / t["se"])
    # The same likelihood, built without any of the project's code.
    fam = sm.families.Binomial(link=sm.families.links.Logit() if link == "logit" else sm.families.links.CLogLog())
    direct = smf.glm("event ~ " + FORMULA, data=intervals, family=fam).fit(tol=1e-12)
    for name in ["Intercept", *TERMS]:
        assert terms[name]["coef"] == pytest.approx(direct.params[name], rel=1e-6, abs=1e-9)
        assert terms[name]["se"] == pytest.approx(direct.bse[name], rel=1e-6)
        assert terms[name]["p"] == pytest.approx(direct.pvalues[name], rel=1e-5, abs=1e-300)
    assert d["loglik"] == pytest.approx(direct.llf, rel=1e-9)


def _frame(records):
    """Person-period frame of records, through the project's events and expansion."""
    rows, params = [], []
    for i, r in enumerate(records):
        params.append(
            {
                "trial_id": i,
                "lr": r["params"]["lr"],
                "variant": r["params"]["tag"]["variant"],
                "batch_size": r["params"]["batch_size"],
            }
        )
        rows += [(i, p["step"], p["acc"]) for p in r["trace"]]
    evals = pd.DataFrame(rows, columns=["trial_id", "step", "acc"])
    trials = pd.DataFrame(params).set_index("trial_id")
    ev = trial_events(evals, AnalysisConfig())
    pp = expand(evals, ev)
    return pp.join(trials, on="trial_id")


@pytest.mark.parametrize("link", ["logit", "cloglog"])
def test_confidence_intervals_cover_at_their_nominal_rate(link):
    rng = np.random.default_rng(2024)
    hits, n = {name: 0 for name in TERMS}, 30
    for _ in range(n):
        records, _ = simulate(rng, 20, link)
        s = fit_hazard(_frame(records), FORMULA, link).summary
        for name, true_coef in TERMS.items():
            hits[name] += s.loc[name, "ci_low"] < np.exp(true_coef) < s.loc[name, "ci_high"]
    # 95% intervals: 26 or more of 30 covering; halved standard errors would cover ~66%.
    assert all(h >= 26 for h in hits.values()), hits


def test_escape_law_basis_recovers_heat_and_noise_elasticities():
    rng = np.random.default_rng(8)
    heat, noise = 3.0, -1.65
    rows = []
    for lr in (1e-3, 3e-3, 1e-2):
        for batch in (4, 8, 16, 32, 64):
            eta0 = -1.0 + heat * np.log(lr / 3e-3) + noise * np.log((lr**2 / batch) / (3e-3**2 / 16))
            for _ in range(150):
                for s in GRID[1:]:
                    ev = rng.random() < hazard_of(eta0 - 2.5 + 0.5 * np.log(s / 1000), "logit")
                    rows.append({"trial_id": len(rows), "t": s, "event": int(ev), "lr": lr, "batch_size": batch})
                    if ev:
                        break
    pp = pd.DataFrame(rows)
    res = fit_hazard(pp, "np.log(t) + np.log(lr) + I(2*np.log(lr) - np.log(batch_size))")
    s = res.summary
    for term, true in (("np.log(lr)", heat), ("I(2 * np.log(lr) - np.log(batch_size))", noise)):
        lo, hi = np.log(s.loc[term, "ci_low"]), np.log(s.loc[term, "ci_high"])
        assert lo < true < hi, (term, s.loc[term].to_dict())


def test_collapsed_fit_equals_the_row_by_row_fit():
    rng = np.random.default_rng(3)
    records, _ = simulate(rng, 25, "logit")
    pp = _frame(records)
    pp["task.vocab_size"] = np.where(pp["trial_id"] % 3 == 0, 88, 80)
    # Batch size varies across trials, so the I(...) term below is not a combination of the others.
    pp["batch_size"] = np.where(pp["trial_id"] % 2 == 0, 16, 32)
    for formula in (
        "np.log(t) + C(lr) * C(variant)",
        "np.log(t) + C(variant) + C(Q('task.vocab_size'))",
        "np.log(t) + np.log(lr) + I(2*np.log(lr) - np.log(batch_size))",
    ):
        used = formula_columns("event ~ " + formula, pp.columns)
        assert used is not None and "t" in used
        fast = fit_hazard(pp, formula, collapse=True)
        slow = fit_hazard(pp, formula, collapse=False)
        pd.testing.assert_frame_equal(fast.summary, slow.summary, rtol=1e-8)
        assert fast.loglik == pytest.approx(slow.loglik, rel=1e-10)
        assert (fast.n_intervals, fast.n_events) == (slow.n_intervals, slow.n_events)
    # A stateful transform learns from the rows it sees: no collapsing there.
    assert formula_columns("event ~ center(np.log(t)) + C(lr)", pp.columns) is None
    assert formula_columns("event ~ C(variant)", pp.columns) == ["variant"]


def test_a_collinear_design_is_refused_naming_the_redundant_term():
    rng = np.random.default_rng(3)
    records, _ = simulate(rng, 25, "logit")
    pp = _frame(records)
    assert pp["batch_size"].nunique() == 1  # so 2 log lr - log bs is a combination of log lr and 1
    formula = "np.log(t) + np.log(lr) + I(2*np.log(lr) - np.log(batch_size))"
    for collapse in (True, False):
        with pytest.raises(UserError) as exc:
            fit_hazard(pp, formula, collapse=collapse)
        msg = str(exc.value)
        assert "\n" not in msg and "collinear (4 columns, rank 3)" in msg
        assert "I(2 * np.log(lr) - np.log(batch_size)) is a combination" in msg
    # Without the constant covariate the same design fits.
    pp["batch_size"] = np.where(pp["trial_id"] % 2 == 0, 16, 32)
    assert np.isfinite(fit_hazard(pp, formula).summary["coef"]).all()


def test_bad_formulas_are_one_line_user_errors():
    rng = np.random.default_rng(1)
    records, _ = simulate(rng, 5, "logit")
    pp = _frame(records)
    with pytest.raises(UserError, match="no_such_param") as e:
        fit_hazard(pp, "np.log(t) + C(no_such_param)")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="left-hand side"):
        fit_hazard(pp, "escaped ~ np.log(t)")
    with pytest.raises(UserError, match="--link"):
        fit_hazard(pp, "np.log(t)", link="probit")
    with pytest.raises(UserError, match="no escapes"):
        fit_hazard(pp.assign(event=0), "np.log(t)")
