"""Event extraction and person-period expansion: the vectorised paths against the per-trace
references, and hand-worked traces pinned to the definitions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis.config import AnalysisConfig, parse_config
from orchestrator.analysis.events import trace_events, trial_events
from orchestrator.analysis.person_period import expand, expand_reference
from orchestrator.errors import UserError

GRID = [1] + list(range(200, 3001, 200))


def _evals(traces: dict[int, list[tuple[int, float]]]) -> pd.DataFrame:
    rows = [(tid, s, a) for tid, tr in traces.items() for s, a in tr]
    return (
        pd.DataFrame(rows, columns=["trial_id", "step", "acc"]).sort_values(["trial_id", "step"]).reset_index(drop=True)
    )


def test_hand_worked_traces_follow_the_definitions():
    cfg = AnalysisConfig()
    chance = [(s, 0.03) for s in GRID]
    escaper = [(s, 0.03 if s < 2400 else 0.9) for s in GRID]
    # Accuracy >= 0.8 at the very first eval only starts the clock: not an escape.
    early = [(1, 0.95)] + [(s, 0.03) for s in GRID[1:]]
    # Dips below 0.005 and recovers: not a collapse; then stays below from 2000 on.
    dead = (
        [(s, 0.03) for s in GRID[:5]]
        + [(GRID[5], 0.001), (GRID[6], 0.02)]
        + [(s, 0.03 if s < 2000 else 0.0) for s in GRID[7:]]
    )
    mid = [(s, 0.03 if s < 2600 else 0.5) for s in GRID]
    esc_then_dead = [(s, 0.9 if 1000 <= s < 2000 else (0.0 if s >= 2000 else 0.03)) for s in GRID]
    nan_dead = [(s, 0.03) for s in GRID[:10]] + [(s, float("nan")) for s in GRID[10:]]
    ev = trial_events(_evals({1: chance, 2: escaper, 3: early, 4: dead, 5: mid, 6: esc_then_dead, 7: nan_dead}), cfg)
    assert ev.loc[1, ["time", "event", "end", "outcome"]].tolist() == [3000, 0, "budget", "flat"]
    assert ev.loc[2, ["escape_step", "time", "event", "outcome"]].tolist() == [2400, 2400, 1, "solved"]
    assert np.isnan(ev.loc[3, "escape_step"]) and ev.loc[3, "event"] == 0
    assert ev.loc[4, ["collapse_step", "time", "end", "outcome"]].tolist() == [2000, 2000, "collapse", "dead"]
    assert ev.loc[5, "outcome"] == "mid" and ev.loc[5, "end"] == "budget"
    # An escape before a collapse is an escape event; the class reads the final accuracy.
    assert ev.loc[6, ["escape_step", "collapse_step", "event", "outcome"]].tolist() == [1000, 2000, 1, "dead"]
    assert ev.loc[7, ["collapse_step", "end"]].tolist() == [GRID[10], "collapse"]
    assert ev.loc[2, "locked"] and not ev.loc[5, "locked"]
    best = trial_events(_evals({6: esc_then_dead}), AnalysisConfig(metric="best"))
    assert best.loc[6, "locked"] and best.loc[6, "metric_acc"] == pytest.approx(0.9)


def _random_traces(rng, n):
    traces = {}
    for tid in range(n):
        m = int(rng.integers(1, 14))
        steps = np.sort(rng.choice(np.arange(0, 4000, 100), size=m, replace=False))
        kind = rng.integers(0, 4)
        acc = rng.uniform(0, 1, m) if kind == 0 else rng.choice([0.0, 0.003, 0.03, 0.5, 0.85], size=m)
        if kind == 2:
            acc[rng.integers(0, m) :] = 0.001
        if kind == 3 and m > 2:
            acc[rng.integers(0, m)] = np.nan
        traces[tid * 7 + 3] = list(zip(steps.tolist(), acc.tolist()))
    return traces


@pytest.mark.parametrize(
    "cfg", [AnalysisConfig(), AnalysisConfig(escape_at=0.5, collapse_below=0.01, lockin=0.6, mid_at=0.1, metric="best")]
)
def test_vectorised_events_match_the_reference(cfg):
    rng = np.random.default_rng(7)
    traces = _random_traces(rng, 400)
    fast = trial_events(_evals(traces), cfg)
    assert list(fast.index) == sorted(traces)
    for tid, tr in traces.items():
        ref = trace_events(tr, cfg)
        got = fast.loc[tid]
        for col in ("n_evals", "first_step", "last_step", "time", "event", "end", "outcome", "locked"):
            assert got[col] == ref[col], (tid, col, tr)
        for col in ("escape_step", "collapse_step"):
            want = np.nan if ref[col] is None else ref[col]
            np.testing.assert_equal(got[col], want)
        for col in ("final_acc", "best_acc", "metric_acc"):
            np.testing.assert_allclose(got[col], ref[col], equal_nan=True)


def test_vectorised_expansion_matches_the_reference():
    rng = np.random.default_rng(11)
    traces = _random_traces(rng, 300)
    evals = _evals(traces)
    ev = trial_events(evals, AnalysisConfig())
    fast = expand(evals, ev)
    ref = expand_reference(evals, ev)
    pd.testing.assert_frame_equal(fast.reset_index(drop=True), ref.reset_index(drop=True), check_dtype=False)
    # Every escaper has exactly one event, in its last interval; others none.
    per = fast.groupby("trial_id")["event"].agg(["sum", "last"])
    esc = ev.loc[per.index, "event"]
    assert (per["sum"] == esc).all() and (per["last"] == esc).all()


def test_usual_grid_gives_t_equal_k_times_eval_every():
    evals = _evals({1: [(s, 0.03 if s < 1000 else 0.9) for s in GRID], 2: [(s, 0.03) for s in [0] + GRID[1:]]})
    ev = trial_events(evals, AnalysisConfig())
    pp = expand(evals, ev)
    one = pp[pp.trial_id == 1]
    assert one["t"].tolist() == [200, 400, 600, 800, 1000]
    assert (one["t"] == one["k"] * 200).all()
    assert one["event"].tolist() == [0, 0, 0, 0, 1]
    two = pp[pp.trial_id == 2]
    assert len(two) == 15 and two["event"].sum() == 0 and two["t"].max() == 3000


def test_config_rejects_unknown_keys_and_bad_thresholds():
    with pytest.raises(UserError, match="lockn"):
        parse_config({"lockn": 0.8})
    with pytest.raises(UserError, match="compare"):
        parse_config({"compare": "a"})
    with pytest.raises(UserError, match="collapse_below"):
        parse_config({"collapse_below": 0.9, "escape_at": 0.8})
    with pytest.raises(UserError, match="status"):
        parse_config({"statuses": "done"})
    cfg = parse_config({"by": "variant, lr", "heatmap": {"x": "lr", "y": "vocab_size"}})
    assert cfg.by == ["variant", "lr"] and cfg.heatmap.y == "vocab_size"
    assert cfg.with_overrides(by="seed", lockin=None).by == ["seed"]
    assert parse_config({"statuses": "all"}).statuses[0] == "pending"
