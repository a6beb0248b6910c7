"""The sequential driver (runner/sequential.py) on a stratified design, on SQLite and
PostgreSQL. The batch runner here writes fixed traces through the store's own functions
instead of training (the driver is under test, not training: tests/test_design_sequential_sweep.py
runs the real thing through Ray). One stratum's contrast is decided early and its remaining
seeds are skipped while the other runs to its last look; each runs at alpha / 2 (Bonferroni),
checked against the boundaries computed directly."""

from __future__ import annotations

import pytest

from orchestrator.design.boundaries import spending_boundaries
from orchestrator.runner.sequential import drive
from orchestrator.spec import load
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.store.sweep_store import SweepStore

SPEC = """
name: strat
fixed: {task: mqar, d_model: 16, n_layers: 1, steps: 20, eval_every: 10}
axes: {arm: [armed_gdn, gated_deltanet], task.K: [4, 8], seed: 0..11}
sequential:
  compare: {by: arm, groups: [armed_gdn, gated_deltanet]}
  test: fisher
  looks: [4, 8, 12]
  alpha: 0.05
  spending: obrien_fleming
  strata: [task.K]
analysis: {lockin: 0.9}
"""


def _trace(params):
    # K = 4: only the armed cell locks in; K = 8: both do (no difference to find).
    locks = params["arm"] == "armed_gdn" or params["task.K"] == 8
    return [(1, 0.01), (10, 0.5), (20, 0.99 if locks else 0.3)]


def test_stratified_driver_decides_each_stratum_on_its_own(db_url):
    sweep = load(text=SPEC)
    engine, _ = open_store_engine(db_url)
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, sweep.name, sweep.text, sweep.hash)
        repo.add_trials(conn, sid, sweep.trials)
    batches: list[list[int]] = []

    def run(batch):
        batches.append([tid for tid, _, _ in batch])
        with engine.begin() as conn:
            for tid, _, params in batch:
                repo.upsert_evals(
                    conn, [{"trial_id": tid, "step": s, "acc": a, "loss": 1.0} for s, a in _trace(params)]
                )
                repo.finish_trial(conn, tid, "completed")
        return {tid: "completed" for tid, _, _ in batch}

    res = drive(sweep.sequential, sweep.axes, sweep.analysis, sid, SweepStore(engine), run)
    by_k = {}
    for r in res.records:
        by_k.setdefault(r.stratum["task.K"], []).append(r)
    assert [r.decision for r in by_k[4]] == ["continue", "reject"]
    assert [r.decision for r in by_k[8]] == ["continue", "continue", "accept"]
    assert by_k[4][-1].seeds_saved == 8 and res.skipped == 8
    # Bonferroni: each stratum's boundaries are the design's at alpha / 2.
    ref = spending_boundaries([4 / 12, 8 / 12, 1.0], 0.025, spending="obrien_fleming")
    for r in by_k[8]:
        assert r.boundary == pytest.approx(ref.z[r.look - 1], rel=1e-6)
    assert by_k[8][-1].alpha_spent == pytest.approx(0.025, rel=1e-6)
    # Look 3 ran only K = 8's seeds 8..11 (both arms): K = 4 was decided at look 2.
    assert [len(b) for b in batches] == [16, 16, 8]
    with engine.connect() as conn:
        rows = repo.sweep_trials(conn, sid)
    skipped = [(p["task.K"], p["seed"]) for _, _, p, st in rows if st == "skipped"]
    assert sorted(skipped) == sorted((4, s) for s in range(8, 12) for _ in range(2))
    # A second drive replays the stored looks: nothing runs, nothing is re-tested.
    again = drive(sweep.sequential, sweep.axes, sweep.analysis, sid, SweepStore(engine), run)
    assert again.ran == 0 and again.records == [] and len(batches) == 3
    with engine.connect() as conn:
        assert len(repo.sequential_looks(conn, sid)) == 5
    engine.dispose()
