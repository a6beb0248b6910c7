"""Every caller gets the same events: seeded random traces with escapes, dips, collapses,
NaN losses, stops and horizons, stored in a real SQLite file, read by the analysis
(``pipeline.prepare``, which the dashboard's grid and the report use), by a sequential look
(``runner.sequential.look_events`` on the store's ``trial_outcomes``) and by the per-trace
reference (``events.trace_events`` on a trace prepared by hand); and the training loop's stop
rule stops exactly where the shared escape rule says a run of escapes is sustained."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from orchestrator.analysis import pipeline
from orchestrator.analysis_config import AnalysisConfig
from orchestrator.events import escape_run, trace_events
from orchestrator.runner.sequential import look_events
from orchestrator.spec import load
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.train.loop import EvalPoint, Trainer

SPEC = """
name: prop
fixed: {task: mqar, d_model: 16, n_layers: 1, steps: 1000, eval_every: 50}
axes: {arm: [armed_gdn, gated_deltanet], seed: 0..29}
"""
COLUMNS = ("time", "event", "end", "outcome", "locked", "escape_step", "collapse_step", "final_acc")


def _random_trace(rng: random.Random) -> tuple[list[tuple[int, float, float]], int | None]:
    """(step, acc, loss) points and the stop step (None: not stopped)."""
    steps = [1] + list(range(50, 1001, 50))
    kind = rng.choice(["flat", "escape", "dip", "collapse", "nan", "nan_acc", "stop"])
    acc = 0.02
    out, stop = [], None
    for i, s in enumerate(steps):
        if kind == "collapse" and i > 4:
            acc = 0.0 if i > 7 else rng.uniform(0.0, 0.01)
        elif kind in ("escape", "stop", "dip", "nan") and i > 3:
            acc = min(1.0, max(0.0, acc + rng.uniform(-0.05, 0.3)))
            if kind == "dip" and i in (9, 10):
                acc = rng.uniform(0.3, 0.79)
        else:
            acc = min(0.5, max(0.0, acc + rng.uniform(-0.05, 0.06)))
        out.append((s, round(acc, 3), 1.0))
        if kind == "nan" and i > 6 and rng.random() < 0.3:
            out[-1] = (s, round(max(acc, 0.85), 3), math.nan)  # a NaN loss with a finite accuracy
            break
        if kind == "nan_acc" and i > 6 and rng.random() < 0.3:
            out[-1] = (s, math.nan, math.nan)
            break
        if kind == "stop" and escape_run([a for _, a, _ in out], 0.8) >= 3 and s < 1000:
            stop = s
            break
    return out, stop


def _reference(points, cfg: AnalysisConfig) -> dict:
    """The per-trace reference on a trace prepared by hand: cut at the horizon, then the
    diverged rule (at-risk: points without a finite accuracy left out; censor: the trace
    ends at its first non-finite point, which censors it)."""
    pts = [p for p in points if cfg.horizon is None or p[0] <= cfg.horizon]
    bad = [i for i, (_, a, loss) in enumerate(pts) if not (math.isfinite(a) and math.isfinite(loss))]
    div = pts[bad[0]][0] if bad else None
    if cfg.diverged == "censor" and bad:
        trace = [(s, a) for s, a, _ in pts[: bad[0] + 1]]
        return trace_events(trace, cfg, diverge_step=div, censor=True)
    trace = [(s, a) for s, a, _ in pts if math.isfinite(a)]
    return trace_events(trace, cfg, diverge_step=div)


CONFIGS = [
    AnalysisConfig(),
    AnalysisConfig(diverged="censor"),
    AnalysisConfig(horizon=600, metric="best", lockin=0.7, escape_at=0.7),
    AnalysisConfig(diverged="censor", horizon=420, stopped_as="solved", collapse_below=0.02),
    AnalysisConfig(stopped_as="solved", escape_at=0.9, lockin=0.95, statuses=["all"]),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_analysis_look_and_reference_agree_on_random_traces(tmp_path, seed):
    rng = random.Random(seed)
    sweep = load(text=SPEC)
    engine, _ = open_store_engine(f"sqlite:///{tmp_path / 'prop.db'}")
    traces = {}
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, sweep.name, sweep.text, sweep.hash)
        ids = repo.add_trials(conn, sid, sweep.trials)
        for key, tid in ids.items():
            points, stop = _random_trace(rng)
            traces[tid] = (points, stop)
            repo.upsert_evals(conn, [{"trial_id": tid, "step": s, "acc": a, "loss": lo} for s, a, lo in points])
            if stop is not None:
                repo.record_stop(conn, tid, stop, 1000, "escape sustained")
            diverged = any(not (math.isfinite(a) and math.isfinite(lo)) for _, a, lo in points)
            repo.finish_trial(conn, tid, "diverged" if diverged else "completed")
    kinds = {
        ("stop" if st else "") + ("nan" if any(math.isnan(lo) for _, _, lo in p) else "") for p, st in traces.values()
    }
    assert {"stop", "nan"} <= kinds  # the cases that matter are drawn
    for cfg in CONFIGS:
        prep = pipeline.prepare(engine, "prop", cfg)
        analysed = prep.trials.set_index("trial_id")
        with engine.connect() as conn:
            outcomes = repo.trial_outcomes(conn, list(traces))
        look = look_events(outcomes, cfg)
        assert sorted(look.index) == sorted(analysed.index)
        for tid in analysed.index:
            points, stop = traces[tid]
            ref = _reference(points, cfg)
            if cfg.stopped_as == "solved" and stop is not None:
                ref = {**ref, "locked": True, "outcome": "solved"}
            for col in COLUMNS:
                a, b, r = analysed.at[tid, col], look.at[tid, col], ref[col]
                if isinstance(r, float) or r is None:
                    r = np.nan if r is None else r
                    assert np.isclose(float(a), r, equal_nan=True) and np.isclose(float(b), r, equal_nan=True), (
                        tid,
                        col,
                        a,
                        b,
                        r,
                    )
                else:
                    assert a == b == r, (tid, col, a, b, r, cfg)
    engine.dispose()


@pytest.mark.parametrize("seed", range(4))
def test_stop_rule_stops_where_the_shared_escape_rule_says(seed):
    rng = random.Random(100 + seed)
    params = dict(load(text=SPEC).trials[0][1])
    for _ in range(25):
        after = rng.randint(1, 4)
        trainer = Trainer(params, stop={"after_escape_evals": after, "escape_at": 0.8})
        accs: list[float] = []
        for i, s in enumerate([1] + list(range(50, 1001, 50))):
            acc = rng.choice([0.1, 0.5, 0.81, 0.9, 0.95, math.nan]) if i else 0.9
            trainer.step = s
            accs.append(acc)
            going = trainer.accept_eval(EvalPoint(s, acc, 1.0, None, 1e-3, 0.0))
            if not going:
                break  # a NaN accuracy: diverged, the stop rule never reached
            sustained = escape_run(accs, 0.8) >= after + 1 and s < 1000
            assert (trainer.stopped_at == s) == sustained
            if trainer.stopped_at is not None:
                # What the analysis sees of the stopped trace: an escape, no later than the stop.
                ev = trace_events(list(zip([1] + list(range(50, s + 1, 50)), accs)), AnalysisConfig())
                assert ev["event"] == 1 and ev["escape_step"] <= s
                break
