"""How a diverged trial counts (``diverged: at-risk | censor``): NaN-loss traces imported
through the CLI, their at-risk intervals (person-period rows, Kaplan-Meier at-risk counts)
checked both ways against counts worked out by hand; the vectorised events against the
per-trace reference on random diverging traces."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from orchestrator import analysis as oa
from orchestrator.analysis.config import AnalysisConfig
from orchestrator.analysis.diverged import analysed_evals
from orchestrator.analysis.events import trace_events, trial_events
from orchestrator.analysis.person_period import expand, expand_reference
from orchestrator.analysis.report import build_report
from orchestrator.cli import main

NAN, INF = float("nan"), float("inf")
STEPS = [1, 100, 200, 300, 400, 500]
LOW, HIGH = 0.05, 0.9

# seed -> [(acc, loss)] at STEPS. Escape: acc >= 0.8 after the first eval.
TRACES = {
    1: [(LOW, 2.0)] * 6,  # clean, never escapes
    2: [(LOW, 2.0)] * 3 + [(HIGH, 0.5)] * 3,  # clean escape at 300
    3: [(LOW, 2.0)] * 2 + [(LOW, NAN)] * 2 + [(HIGH, NAN)] * 2,  # NaN loss from 200, escape at 400
    4: [(LOW, 2.0)] * 3 + [(LOW, NAN)] * 2 + [(None, NAN)],  # NaN loss from 300, no acc at 500
    5: [(LOW, 2.0), (HIGH, INF)] + [(HIGH, NAN)] * 4,  # diverges at 100, the step it reaches 0.9
    6: [(LOW, NAN)] * 6,  # NaN loss from its first eval
}
# Worked by hand from the definitions (escape, censoring time, intervals closed at t <= time).
# at-risk: every eval with a finite accuracy counts, the trial at risk until its last one.
AT_RISK = {
    "time": {1: 500, 2: 300, 3: 400, 4: 400, 5: 100, 6: 500},
    "event": {1: 0, 2: 1, 3: 1, 4: 0, 5: 1, 6: 0},
    "intervals": {1: 5, 2: 3, 3: 4, 4: 4, 5: 1, 6: 5},  # 22 run-intervals, 3 escapes
    "km_at_risk": {1: 6, 100: 6, 200: 5, 300: 5, 400: 4, 500: 2},
}
# censor: the trace ends at the first non-finite point, which closes an interval without an
# event and whose accuracy is not read (seed 5's 0.9 at step 100 is no escape).
CENSOR = {
    "time": {1: 500, 2: 300, 3: 200, 4: 300, 5: 100, 6: 1},
    "event": {1: 0, 2: 1, 3: 0, 4: 0, 5: 0, 6: 0},
    "intervals": {1: 5, 2: 3, 3: 2, 4: 3, 5: 1, 6: 0},  # 14 run-intervals, 1 escape
    "km_at_risk": {1: 6, 100: 5, 200: 4, 300: 3, 400: 1, 500: 1},
}


def _jsonl(path):
    lines = []
    for seed, trace in TRACES.items():
        points = [{"step": s, "acc": a, "loss": loss} for s, (a, loss) in zip(STEPS, trace)]
        lines.append(json.dumps({"params": {"arm": "mlstm", "seed": seed, "task": "mad_recall"}, "trace": points}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def imported(db_url, tmp_path, capsys):
    code = main(["import", str(_jsonl(tmp_path / "nan_loss.jsonl")), "--sweep", "nanloss", "--db", db_url])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "6 trials (6 new, 4 diverged, 36 eval rows)" in out.out
    return db_url


def _km_at_risk(res, steps) -> dict[int, int]:
    """lifelines' at-risk count at each step: its event table has a row at each observed
    duration, and the count at ``t`` is the one at the first such row at or after ``t``."""
    table = res.fitters["all"].event_table["at_risk"]
    out = {}
    for t in steps:
        later = table[table.index >= t]
        out[t] = int(later.iloc[0]) if len(later) else 0
    return {t: n for t, n in out.items() if n}


@pytest.mark.parametrize("rule, want", [("at-risk", AT_RISK), ("censor", CENSOR)])
def test_nan_loss_traces_at_risk_intervals_both_ways(imported, rule, want):
    prep = oa.prepare(imported, "nanloss", diverged=rule)
    ev = prep.trials.set_index("seed")
    assert ev["time"].to_dict() == want["time"]
    assert ev["event"].to_dict() == want["event"]
    pp = oa.person_period(prep.data.evals, prep.trials)
    seed_of = prep.trials.set_index("trial_id")["seed"]
    per_trial = pp.groupby(pp["trial_id"].map(seed_of)).size().reindex(list(TRACES), fill_value=0)
    assert per_trial.to_dict() == want["intervals"]
    assert len(pp) == sum(want["intervals"].values()) and pp["event"].sum() == sum(want["event"].values())
    # The KM at-risk counts are the person-period rows closed at each step (plus, censored,
    # the trial censored at its first eval).
    km = oa.km(imported, "nanloss", diverged=rule)
    assert _km_at_risk(km, STEPS) == want["km_at_risk"]
    assert {t: int(n) for t, n in pp.groupby("t").size().items()} == {
        t: n for t, n in want["km_at_risk"].items() if t > 1
    }
    figures = km.groups["all"]
    assert figures["escapes"] == sum(want["event"].values())
    assert figures["censored_at_divergence"] == (4 if rule == "censor" else 0)
    # Every diverged trial is named, in both rules, from its first non-finite point.
    assert ev["diverge_step"].dropna().astype(int).to_dict() == {3: 200, 4: 300, 5: 100, 6: 1}


def test_the_output_says_which_rule_was_used(imported, capsys):
    assert main(["analyze", "nanloss", "km", "--db", imported]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        "diverged (a non-finite loss or accuracy): 4 of 6 trial(s), at risk until their last eval with a finite "
        "accuracy (--diverged at-risk; 'censor' censors them at divergence)"
    )
    assert main(["analyze", "nanloss", "hazard", "--db", imported, "--diverged", "censor", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["n_intervals"], res["n_events"]) == (14, 1)
    assert res["diverged"] == {"rule": "censor", "trials": 4}
    assert main(["analyze", "nanloss", "hazard", "--db", imported, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["n_intervals"], res["n_events"], res["diverged"]["rule"]) == (22, 3, "at-risk")
    rep = build_report(oa.prepare(imported, "nanloss", diverged="censor"), write=False)
    assert "4 of 6 trial(s), censored at divergence, their first non-finite point" in rep.text()
    assert rep.to_dict()["config"]["diverged"] == "censor"
    code = main(["analyze", "nanloss", "km", "--db", imported, "--diverged", "drop"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "diverged" in err


def _random_diverging(rng, n):
    """Traces (trial -> [(step, acc, nonfinite)]) where about half diverge at a random point,
    some with accuracies missing after it."""
    out = {}
    for tid in range(n):
        m = int(rng.integers(1, 12))
        steps = np.sort(rng.choice(np.arange(0, 3000, 100), size=m, replace=False))
        acc = rng.choice([0.0, 0.003, 0.03, 0.5, 0.85, 0.95], size=m).astype(float)
        bad = np.zeros(m, dtype=bool)
        if rng.random() < 0.6:
            bad[int(rng.integers(0, m)) :] = True
            acc[bad & (rng.random(m) < 0.3)] = np.nan
        out[tid * 5 + 2] = list(zip(steps.tolist(), acc.tolist(), bad.tolist()))
    return out


@pytest.mark.parametrize("rule", ["at-risk", "censor"])
def test_vectorised_events_match_the_reference_under_each_rule(rule):
    traces = _random_diverging(np.random.default_rng(3), 400)
    raw = pd.DataFrame(
        [(tid, s, a, b) for tid, tr in traces.items() for s, a, b in tr],
        columns=["trial_id", "step", "acc", "nonfinite"],
    )
    evals = analysed_evals(raw, rule)
    cfg = AnalysisConfig(diverged=rule)
    fast = trial_events(evals, cfg)
    for tid, tr in traces.items():
        div = next((s for s, a, b in tr if b or a != a), None)
        if rule == "at-risk":
            kept = [(s, a) for s, a, _ in tr if a == a]
            ref = trace_events(kept, cfg, diverge_step=div)
        else:
            kept = [(s, a) for s, a, _ in tr if div is None or s <= div]
            ref = trace_events(kept, cfg, diverge_step=div, censor=div is not None)
        if not ref:
            assert tid not in fast.index
            continue
        got = fast.loc[tid]
        for col in ("n_evals", "last_step", "time", "event", "end", "outcome", "locked"):
            assert got[col] == ref[col], (tid, col, tr)
        for col in ("escape_step", "collapse_step", "diverge_step"):
            np.testing.assert_equal(got[col], np.nan if ref[col] is None else ref[col])
        np.testing.assert_allclose(got["final_acc"], ref["final_acc"], equal_nan=True)
    pd.testing.assert_frame_equal(
        expand(evals, fast).reset_index(drop=True),
        expand_reference(evals, fast).reset_index(drop=True),
        check_dtype=False,
    )


@pytest.mark.parametrize("rule", ["at-risk", "censor"])
@pytest.mark.parametrize("diverging", [True, False])
def test_analysed_rows_equal_the_reference_and_share_the_input_columns(rule, diverging):
    """The analysed rows are the input's columns plus two (the reference: pandas' ``assign``
    and a boolean cut), on any index; when no row is cut they share the input's arrays
    (5 million rows are not copied) and the input is left as it was."""
    from orchestrator.events import divergence_steps

    rng = np.random.default_rng(5)
    if diverging:
        traces = _random_diverging(rng, 200)
        raw = pd.DataFrame(
            [(tid, s, a, b) for tid, tr in traces.items() for s, a, b in tr],
            columns=["trial_id", "step", "acc", "nonfinite"],
        )
    else:
        n = 40 * 30
        raw = pd.DataFrame(
            {
                "trial_id": np.repeat(np.arange(40), 30),
                "step": np.tile(np.arange(30) * 100, 40),
                "acc": rng.random(n),
                "nonfinite": np.zeros(n, dtype=bool),
            }
        )
    for frame in (raw, raw.set_axis(raw.index * 3 + 7)):  # a RangeIndex, and not
        before = frame.copy()
        got = analysed_evals(frame, rule)
        div = divergence_steps(frame)
        step = frame["step"].to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            censor = (step == div) if rule == "censor" else np.zeros(len(frame), dtype=bool)
            keep = np.isfinite(frame["acc"].to_numpy()) if rule == "at-risk" else np.isnan(div) | (step <= div)
        want = frame.assign(diverge_step=div, censor=censor)[keep].reset_index(drop=True)
        pd.testing.assert_frame_equal(got, want)
        pd.testing.assert_frame_equal(frame, before)
        if not diverging and frame.index.equals(pd.RangeIndex(len(frame))):
            assert np.shares_memory(got["acc"].to_numpy(), frame["acc"].to_numpy())


def test_divergence_steps_equal_pandas_grouping_in_any_order():
    """Each row's trial's first non-finite step (NaN: none), against pandas' grouped minimum
    (the reference), on sorted and shuffled rows, with and without any divergence."""
    from orchestrator.events import divergence_steps

    rng = np.random.default_rng(11)
    traces = _random_diverging(rng, 300)
    raw = pd.DataFrame(
        [(tid, s, a, b) for tid, tr in traces.items() for s, a, b in tr],
        columns=["trial_id", "step", "acc", "nonfinite"],
    )
    clean = raw.assign(acc=raw["acc"].fillna(0.5), nonfinite=False)
    for frame in (raw, raw.sample(frac=1, random_state=2), clean, clean.sample(frac=1, random_state=3)):
        bad = ~np.isfinite(frame["acc"].to_numpy()) | frame["nonfinite"].to_numpy()
        marked = pd.Series(np.where(bad, frame["step"].to_numpy(dtype=float), np.nan))
        want = marked.groupby(frame["trial_id"].to_numpy()).transform("min").to_numpy()
        np.testing.assert_array_equal(divergence_steps(frame), want)
    assert np.isnan(divergence_steps(clean)).all() and not np.isnan(divergence_steps(raw)).all()
