"""Parameter importance (orchestrator/analysis/importance.py) against optuna run
independently: the same trials read with plain SQL from the ``trial_final`` view, a study
built here with optuna's own API, ``optuna.importance.get_param_importances`` with fANOVA at
seed 0. And a known truth: an outcome that depends on one parameter only."""

from __future__ import annotations

import json

import optuna
import pytest
import sqlalchemy as sa
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.importance import FanovaImportanceEvaluator, get_param_importances

from orchestrator import spec
from orchestrator.analysis import importance as imp
from orchestrator.analysis import pipeline
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine

from ui_support import QUICK, QUICK_SPEC, make_quick_db


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('imp') / 'q.db'}"
    make_quick_db(url)
    return url


def _sql_study(url: str, sweep: str, value) -> tuple[optuna.Study, list[str]]:
    """The study built without the product: trial_final rows, distributions by hand (arm
    and the two-level lr categorical, the five seeds an int range)."""
    engine, _ = open_store_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT params, final_acc FROM trial_final WHERE sweep = :s ORDER BY trial_id"), {"s": sweep}
        ).all()
    engine.dispose()
    params = [json.loads(p) if isinstance(p, str) else p for p, _ in rows]
    dists = {
        "arm": CategoricalDistribution(sorted({p["arm"] for p in params})),
        "lr": CategoricalDistribution(sorted({p["lr"] for p in params})),
        "seed": IntDistribution(min(p["seed"] for p in params), max(p["seed"] for p in params)),
    }
    study = optuna.create_study(direction="maximize")
    study.add_trials(
        [
            optuna.trial.create_trial(params={k: p[k] for k in dists}, distributions=dists, value=float(value(final)))
            for p, (_, final) in zip(params, rows)
        ]
    )
    return study, list(dists)


@pytest.mark.parametrize("outcome,value", [("final_acc", lambda f: f), ("lockin", lambda f: float(f >= 0.9))])
def test_matches_optuna_on_a_sql_built_study(quick, outcome, value):
    prep = pipeline.prepare(quick, QUICK, lockin=0.9)
    got = imp.importance(prep.trials, prep.data.params, outcome)
    study, names = _sql_study(quick, QUICK, value)
    want = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0), params=names)
    assert got.method == "fANOVA (optuna.importance, seed 0)"
    assert got.n_trials == 20 and set(got.importances) == {"arm", "lr", "seed"}
    assert got.kinds == {"arm": "categorical", "lr": "categorical", "seed": "int"}
    for p in names:
        assert got.importances[p] == pytest.approx(want[p], abs=1e-9), p
    assert sum(got.importances.values()) == pytest.approx(1.0)
    # In this design the arm decides most of the outcome.
    assert max(got.importances, key=got.importances.get) == "arm"


def test_one_parameter_decides_the_outcome(tmp_path):
    url = f"sqlite:///{tmp_path / 'truth.db'}"
    sweep = spec.load(text=QUICK_SPEC.replace(f"name: {QUICK}", "name: truth"))
    engine, _ = open_store_engine(url)
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, sweep.name, sweep.text, sweep.hash)
        ids = repo.add_trials(conn, sid, sweep.trials)
        rows = []
        for key, p in sweep.trials:
            final = 0.9 if p["lr"] > 2e-3 else 0.2  # lr only: arm and seed play no part
            rows += [{"trial_id": ids[key], "step": s, "acc": final, "loss": 1.0} for s in (100, 200)]
            repo.mark_running(conn, ids[key])
        repo.upsert_evals(conn, rows)
        for key, _ in sweep.trials:
            repo.finish_trial(conn, ids[key], "completed")
    engine.dispose()
    prep = pipeline.prepare(url, "truth")
    got = imp.importance(prep.trials, prep.data.params, "final_acc")
    assert got.importances["lr"] > 0.95, got.importances
    assert got.importances["arm"] < 0.03 and got.importances["seed"] < 0.03
    assert list(got.importances)[0] == "lr"
    assert "fANOVA (optuna.importance, seed 0)" in got.summary()


def test_constant_outcome_and_bad_outcome_are_said(quick):
    prep = pipeline.prepare(quick, QUICK)
    one = prep.trials[prep.trials["arm"] == "gated_deltanet"]
    # Every unarmed trial at lr 1e-3 stays unlocked: lock-in is the same everywhere.
    flat = one[one["lr"] < 2e-3]
    got = imp.importance(flat, prep.data.params, "lockin")
    assert got.importances == {} and "same in every trial" in got.note
    with pytest.raises(Exception, match="outcome 'nope'"):
        imp.importance(prep.trials, prep.data.params, "nope")


def test_distributions_pick_categorical_for_strings_and_few_levels():
    import pandas as pd

    frame = pd.DataFrame(
        {"s": ["a", "b", "a", "c"], "few": [1e-3, 3e-3, 1e-3, 1e-3], "n": [1, 2, 3, 4], "x": [1e-5, 1e-3, 0.1, 1.0]}
    )
    d = imp.distributions(frame, ["s", "few", "n", "x"])
    assert isinstance(d["s"], CategoricalDistribution) and isinstance(d["few"], CategoricalDistribution)
    assert isinstance(d["n"], IntDistribution) and (d["n"].low, d["n"].high) == (1, 4)
    assert d["x"].log is True


def test_cli_prints_each_outcome_with_the_method(quick, capsys):
    from orchestrator.cli import main

    assert main(["analyze", QUICK, "importance", "--db", quick]) == 0
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if line.startswith("parameter importance for ")]
    assert len(heads) == 3 and all("fANOVA (optuna.importance, seed 0), 20 trials" in h for h in heads)
    prep = pipeline.prepare(quick, QUICK, lockin=0.9)
    want = imp.importance(prep.trials, prep.data.params, "final_acc").importances
    block = out.split("parameter importance for final accuracy")[1].splitlines()[1:4]
    assert {line.split()[0]: float(line.split()[1]) for line in block} == pytest.approx(want, abs=1e-4)
    assert main(["analyze", QUICK, "importance", "--db", quick, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["method"] == "fANOVA (optuna.importance, seed 0)"
    assert [o["outcome"] for o in data["outcomes"]] == ["lockin", "final_acc", "escape_step"]


def test_trials_the_stop_rule_ended_are_left_out_of_the_state_at_budget(quick):
    prep = pipeline.prepare(quick, QUICK, lockin=0.9)
    trials = prep.trials.copy()
    # Two locked-in trials ended by the stop rule (their final accuracy is then unknown).
    ended = trials.index[trials["locked"].astype(bool)][:2]
    trials["stopped_at"] = float("nan")
    trials.loc[ended, "stopped_at"] = 300.0
    got = imp.importance(trials, prep.data.params, "final_acc")
    assert (got.n_trials, got.dropped, got.stopped) == (18, 2, 2)
    assert "2 without a known outcome left out, 2 of them ended by the stop rule" in got.summary()
    assert imp.importance(trials, prep.data.params, "lockin", stopped_as="solved").n_trials == 20
    assert imp.importance(trials, prep.data.params, "lockin").n_trials == 18
    assert imp.importance(trials, prep.data.params, "escape_step").n_trials == 20  # escape times are unaffected


def test_past_the_fanova_bound_the_forests_impurity_importance_named_so(quick):
    from optuna.importance import MeanDecreaseImpurityImportanceEvaluator

    prep = pipeline.prepare(quick, QUICK, lockin=0.9)
    got = imp.importance(prep.trials, prep.data.params, "final_acc", fanova_max=10)
    assert got.method == "random-forest mean decrease in impurity (optuna.importance, seed 0)"
    study, names = _sql_study(quick, QUICK, lambda f: f)
    want = get_param_importances(study, evaluator=MeanDecreaseImpurityImportanceEvaluator(seed=0), params=names)
    assert got.importances == pytest.approx(dict(want), abs=1e-9)
    assert imp.importance(prep.trials, prep.data.params, "final_acc").method == imp.METHOD  # 20 <= 1,000
