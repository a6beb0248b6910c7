"""Recall scaling-law fits (``orchestrator analyze SWEEP scaling``): the probit fit against
statsmodels, recovery of a known boundary from simulated grids, the best-of-seeds reduction
against brute force, and the command end to end on a database shaped like
``sweeps/recall_scaling.yaml``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from orchestrator import spec as specs
from orchestrator.analysis.config import parse_config
from orchestrator.store.import_jsonl import write_records
from orchestrator.analysis.scaling import analyze, fit_probit, grid_points
from orchestrator.cli import main
from orchestrator.errors import UserError
from orchestrator.store.engine import open_store_engine

SPEC = Path(__file__).resolve().parents[1] / "sweeps" / "recall_scaling.yaml"


def law_acc(r, V, nf, kappa):
    """The paper's law with the table floor 1/Nf: the simulation's ground truth."""
    c = 1.0 / nf
    return c + (1 - c) * norm.cdf(kappa * np.sqrt(r) - np.sqrt(2 * np.log(V)))


def test_probit_fit_without_floor_is_the_binomial_probit_glm():
    import statsmodels.api as sm

    rng = np.random.default_rng(1)
    x = np.linspace(-2.5, 3.0, 31)
    y = rng.binomial(150, norm.cdf(-0.4 + 1.3 * x)) / 150
    f = fit_probit(x, y, 0.0)
    glm = sm.GLM(y, sm.add_constant(x), family=sm.families.Binomial(link=sm.families.links.Probit())).fit(scale="X2")
    assert np.allclose([f.alpha, f.beta], glm.params, rtol=1e-5, atol=1e-6)
    assert np.allclose(f.cov, glm.cov_params(), rtol=1e-3)
    assert math.isclose(f.x50, -glm.params[0] / glm.params[1], rel_tol=1e-5)


def test_probit_fit_with_a_floor_recovers_its_parameters():
    rng = np.random.default_rng(2)
    x = np.repeat(np.linspace(0.5, 8.0, 16), 4)
    floor = np.full_like(x, 1 / 16)
    mu = floor + (1 - floor) * norm.cdf(-3.0 + 0.75 * x)
    y = rng.binomial(4000, mu) / 4000
    f = fit_probit(x, y, floor)
    assert abs(f.alpha + 3.0) < 0.1 and abs(f.beta - 0.75) < 0.03
    assert abs(f.x50 - 4.0) < 3 * f.x50_se + 1e-9 and f.x50_se < 0.05
    # Ignoring the floor biases the midpoint down: the floor matters.
    assert fit_probit(x, y, 0.0).x50 < f.x50 - 0.05


def test_probit_fit_refuses_a_degenerate_design():
    with pytest.raises(UserError):
        fit_probit(np.array([1.0, 1.0, 1.0]), np.array([0.1, 0.5, 0.9]))


def simulated_trials(kappa=0.5, vocabs=(256, 1024, 8192), seeds=3, seed=0) -> pd.DataFrame:
    """Trials on a D x N x Nf grid with events attached (``metric_acc``); seed 0 follows the
    law (plus sampling noise), other seeds are optimisation failures that score less."""
    rng = np.random.default_rng(seed)
    rows = []
    for V in vocabs:
        for nf in (16, 32, 64):
            for D in (8, 16, 32, 64, 128):
                for N in (2, 4, 8, 16, 32):
                    p = law_acc(N * D / nf, V, nf, kappa)
                    for s in range(seeds):
                        acc = rng.binomial(4096, p) / 4096
                        if s > 0:
                            acc *= rng.uniform(0.2, 0.9)
                        rows.append(
                            {
                                "task": "ar_scaling",
                                "vocab_size": V,
                                "n_facts": nf,
                                "d_model": D,
                                "d_state": N,
                                "n_layers": 1,
                                "seed": s,
                                "metric_acc": acc,
                            }
                        )
    return pd.DataFrame(rows)


def test_best_of_seeds_grid_points_match_brute_force():
    trials = simulated_trials(vocabs=(1024,))
    cfg = parse_config({"by": ["task"]})
    pts = grid_points(trials, cfg)
    assert len(pts) == 3 * 25 and set(pts["n_seeds"]) == {3}
    for _, row in pts.sample(10, random_state=0).iterrows():
        sub = trials[
            (trials["d_model"] == row["D"]) & (trials["d_state"] == row["N_eff"]) & (trials["n_facts"] == row["Nf"])
        ]
        assert row["acc"] == sub["metric_acc"].max()
        assert row["r"] == row["N_eff"] * row["D"] / row["Nf"]
        assert row["floor"] == 1 / row["Nf"]
    mean = grid_points(trials, parse_config({"scaling": {"seeds": "mean"}}))
    assert np.allclose(
        sorted(mean["acc"]),
        sorted(trials.groupby(["vocab_size", "d_model", "d_state", "n_facts"])["metric_acc"].mean()),
    )
    assert len(grid_points(trials, parse_config({"scaling": {"seeds": "all"}}))) == len(trials)


def test_scaling_fit_recovers_a_known_boundary():
    kappa = 0.5  # boundary r* = 2 ln V / kappa^2: N D = 8 Nf ln V
    res = analyze(simulated_trials(kappa=kappa), parse_config({"by": ["task"]}))
    (g,) = res.groups
    assert abs(g.law.kappa - kappa) / kappa < 0.02
    assert g.law.c_law_ci[0] <= 8.0 <= g.law.c_law_ci[1]
    for v in g.vocabs:
        truth = 2 * math.log(v.V) / kappa**2
        assert abs(v.r_star - truth) / truth < 0.05, (v.V, v.r_star, truth)
        assert v.r_star_ci[0] < truth < v.r_star_ci[1]
    # The free boundaries grow like ln V: slope 1 on ln ln V.
    assert g.slope_ci[0] < 1.0 < g.slope_ci[1] and abs(g.slope - 1.0) < 0.2
    table = res.summary
    assert list(table["V"]) == [256, 1024, 8192]
    assert np.allclose(table["law_r_star"], 2 * np.log(table["V"]) / g.law.kappa**2)


def test_scaling_fit_tells_a_different_law_apart():
    """A boundary growing like (ln V)^2 (not the Omega(Nf log V) law) shows a slope near 2."""
    rng = np.random.default_rng(3)
    rows = []
    for V in (64, 1024, 65536):
        target = 0.6 * math.log(V) ** 2  # r* grows like (ln V)^2
        for r in np.geomspace(target / 8, target * 8, 25):
            p = 1 / 32 + (1 - 1 / 32) * norm.cdf(3.0 * (math.sqrt(r) - math.sqrt(target)))
            rows.append(
                {
                    "vocab_size": V,
                    "n_facts": 32,
                    "d_model": r * 32,
                    "d_state": 1.0,
                    "n_layers": 1,
                    "metric_acc": rng.binomial(4096, p) / 4096,
                }
            )
    res = analyze(pd.DataFrame(rows), parse_config({}))
    g = res.groups[0]
    for v in g.vocabs:
        truth = 0.6 * math.log(v.V) ** 2
        assert abs(v.r_star - truth) / truth < 0.05
    assert g.slope_ci[0] > 1.5 and abs(g.slope - 2.0) < 0.2


def test_a_grid_that_never_crosses_the_boundary_says_so():
    trials = simulated_trials(kappa=0.05, vocabs=(8192,))  # boundary far above the grid
    res = analyze(trials, parse_config({}))
    (v,) = res.groups[0].vocabs
    assert v.r_star is None and "above the largest r" in v.note
    assert "above the largest r" in res.text()


def test_missing_scaling_column_is_a_one_line_error():
    trials = simulated_trials(vocabs=(256,)).drop(columns=["d_state"])
    with pytest.raises(UserError, match="N = 'd_state' is not a parameter"):
        analyze(trials, parse_config({}))


def test_analyze_scaling_end_to_end_on_the_recall_scaling_design(tmp_path, capsys):
    """Traces for every trial of sweeps/recall_scaling.yaml simulated from the law (one
    kappa per task; N_eff = layers x N), imported, then `orchestrator analyze SPEC scaling`
    recovers each task's constant and prints the boundary table."""
    sweep = specs.load(SPEC)
    kappa = {"ar_scaling": 0.5, "mqar_scaling": 0.35}
    rng = np.random.default_rng(4)
    records = []
    for _, p in sweep.trials:
        r = p["n_layers"] * p["model.d_state"] * p["d_model"] / p["task.n_facts"]
        acc = law_acc(r, p["task.vocab_size"], p["task.n_facts"], kappa[p["task"]])
        acc = rng.binomial(2048, acc) / 2048 * (1.0 if p["seed"] == 0 else 0.5)
        records.append(
            {"params": p, "trace": [{"step": 1, "acc": 1 / p["task.n_facts"]}, {"step": 4000, "acc": float(acc)}]}
        )
    db = f"sqlite:///{tmp_path / 'scaling.db'}"
    write_records(open_store_engine(db)[0], "recall_scaling", records)
    code = main(["analyze", str(SPEC), "scaling", "--db", db, "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    d = json.loads(cap.out)
    groups = {g["group"]: g for g in d["groups"]}
    # by: task / pattern / heads / n_layers / norm, from the spec's analysis block.
    assert set(groups) == {
        "ar_scaling/mha/1/1/false",
        "mqar_scaling/mha/1/1/false",
        "ar_scaling/mha/1/1/true",
        "ar_scaling/mha/1/2/true",
        "ar_scaling/mha/1/4/true",
        "mqar_scaling/mha/4/1/false",
        "mqar_scaling/mka/4/1/false",
        "mqar_scaling/mqa/4/1/false",
        "mqar_scaling/mva/4/1/false",
    }
    for name, g in groups.items():
        want = 2 / kappa[name.split("/")[0]] ** 2
        assert abs(g["law"]["c_law"] - want) / want < 0.05, (name, g["law"])
    rows = [r for r in d["summary"] if r["group"] == "ar_scaling/mha/1/1/false"]
    assert [r["V"] for r in rows] == [256, 1024, 8192]
    for r in rows:
        truth = 2 * math.log(r["V"]) / kappa["ar_scaling"] ** 2
        assert abs(r["r_star"] - truth) / truth < 0.1
    code = main(
        ["analyze", str(SPEC), "scaling", "--db", db, "--where", "task = 'ar_scaling' AND n_layers = 1 AND norm = 0"]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "group ar_scaling/mha/1/1/false" in text and "law: kappa = " in text
    assert "/true" not in text
    assert "slope of ln r* on ln ln V" in text
    # A spec naming a parameter the sweep lacks fails with one line, exit 2.
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPEC.read_text().replace("N: d_state", "N: d_sate"))
    assert main(["analyze", str(bad), "scaling", "--db", db]) == 2
    assert "scaling: N = 'd_sate' is not a parameter" in capsys.readouterr().err


def test_analysis_block_refuses_bad_scaling_and_contrast_options():
    with pytest.raises(UserError, match="scaling.floor"):
        parse_config({"scaling": {"floor": 1.5}})
    with pytest.raises(UserError, match="scaling.Nff"):
        parse_config({"scaling": {"Nff": "n_facts"}})
    with pytest.raises(UserError, match="two different group labels"):
        parse_config({"contrasts": [["ns5", "ns5"]]})
    with pytest.raises(UserError, match="horizon"):
        parse_config({"horizon": 0})
    cfg = parse_config({"contrasts": ["ns5,baseline"], "scaling": {"floor": 0.05}})
    assert cfg.contrasts == [["ns5", "baseline"]] and cfg.scaling.floor == 0.05
