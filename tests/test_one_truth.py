"""One definition of every event: a sequential look decides on what ``orchestrator analyze``
reports, and ``orchestrator design replay`` on an imported copy of the sweep prints what the
live look stored.

The three cases a reviewer measured with the look's old private copy of the event rules,
each on SQLite and PostgreSQL:

1. log-rank, arm A: 4 of 8 seeds escape and 4 collapse at step 200; arm B: 1 escape in 8. The
   old look censored the collapsed seeds at the budget (z = 1.696, accept) where the analysis
   censors them at their collapse (chi2 = 13.99 with lifelines' variance);
2. Fisher, traces that end at a NaN-loss point with accuracy 0.85 under ``diverged: censor``:
   the old look read that accuracy as lock-in (p = 0.0101, reject); the analysis does not;
3. the same traces, log-rank: the old look counted the divergence point as an escape.

The looks are driven through the runner's own gate (``runner.sequential.drive``) with a batch
runner that writes fixed traces through the store's functions: the decision is under test,
not training (tests/test_design_sequential_sweep.py trains through Ray).
"""

from __future__ import annotations

import json
import math

import pytest

from orchestrator import analysis as oa
from orchestrator.cli import main
from orchestrator.runner.sequential import drive
from orchestrator.spec import load
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.store.sweep_store import SweepStore

STEPS = list(range(100, 1001, 100))

SPEC = """
name: {name}
fixed: {{task: mqar, d_model: 16, n_layers: 1, steps: 1000, eval_every: 100}}
axes: {{arm: [armed_gdn, gated_deltanet], seed: 0..7}}
sequential:
  compare: {{by: arm, groups: [armed_gdn, gated_deltanet]}}
  test: {test}
  looks: [4, 8]
  alpha: 0.05
analysis: {analysis}
"""


def _collapse_trace(seed: int, arm: str) -> list[tuple[int, float, float]]:
    """Case 1: (step, acc, loss). Arm A: even seeds escape at 300 + 100 * seed/2, odd ones
    collapse at step 200; arm B: seed 3 escapes at 900, the rest sit on a plateau."""
    if arm == "armed_gdn":
        if seed % 2 == 0:
            at = 300 + 100 * (seed // 2)
            return [(1, 0.01, 4.0)] + [(s, 0.95 if s >= at else 0.1, 1.0) for s in STEPS]
        return [(1, 0.01, 4.0), (100, 0.05, 2.0)] + [(s, 0.0, 3.0) for s in STEPS[1:]]
    if seed == 3:
        return [(1, 0.01, 4.0)] + [(s, 0.95 if s >= 900 else 0.1, 1.0) for s in STEPS]
    return [(1, 0.01, 4.0)] + [(s, 0.1, 2.0) for s in STEPS]


def _nan_trace(seed: int, arm: str) -> list[tuple[int, float, float]]:
    """Cases 2 and 3: arm A's seeds 0..5 end at a NaN-loss point whose accuracy is 0.85 (after
    a plateau at 0.3); the rest, and arm B, plateau at 0.1 to the budget."""
    if arm == "armed_gdn" and seed < 6:
        end = 500 + 100 * (seed % 3)
        return [(1, 0.01, 4.0)] + [(s, 0.3, 1.5) for s in STEPS if s < end] + [(end, 0.85, math.nan)]
    return [(1, 0.01, 4.0)] + [(s, 0.1, 2.0) for s in STEPS]


CASES = {
    "collapse_logrank": ("logrank", "{escape_at: 0.8, lockin: 0.8}", _collapse_trace),
    "nan_fisher": ("fisher", "{escape_at: 0.8, lockin: 0.8, diverged: censor}", _nan_trace),
    "nan_logrank": ("logrank", "{escape_at: 0.8, lockin: 0.8, diverged: censor}", _nan_trace),
}


def _write(engine, tid: int, trace) -> str:
    with engine.begin() as conn:
        repo.upsert_evals(conn, [{"trial_id": tid, "step": s, "acc": a, "loss": loss} for s, a, loss in trace])
        status = "diverged" if any(math.isnan(loss) for _, _, loss in trace) else "completed"
        repo.finish_trial(conn, tid, status)
    return status


def _cli(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return cap.out


@pytest.mark.parametrize("case", list(CASES))
def test_look_and_analyze_agree_and_replay_prints_the_stored_look(case, db_url, tmp_path, capsys):
    test, block, trace_of = CASES[case]
    name = f"truth_{case}"
    text = SPEC.format(name=name, test=test, analysis=block)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(text)
    sweep = load(spec_path)
    engine, _ = open_store_engine(db_url)
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, sweep.name, sweep.text, sweep.hash)
        repo.add_trials(conn, sid, sweep.trials)

    def run(batch):
        return {tid: _write(engine, tid, trace_of(params["seed"], params["arm"])) for tid, _, params in batch}

    res = drive(sweep.sequential, sweep.axes, sweep.analysis, sid, SweepStore(engine), run)
    assert res.records, "no look was decided"
    cfg = sweep.analysis
    for rec in res.records:
        n_k = sweep.sequential.looks[rec.look - 1]
        where = f"seed < {n_k}"
        if test == "logrank":
            got = oa.logrank(engine, name, cfg, by="arm", compare="armed_gdn,gated_deltanet", where=where).to_dict()
            assert got["variance"] == rec.variance == "permutation"  # auto at 4 and 8 seeds
            assert got["z"] == pytest.approx(rec.statistic, abs=1e-9)
            assert got["test_statistic"] == pytest.approx(rec.statistic**2, abs=1e-9)
        else:
            got = oa.fisher(engine, name, cfg, by="arm", compare="armed_gdn,gated_deltanet", where=where).to_dict()
        assert got["p_value"] == pytest.approx(rec.p, abs=1e-9)
        same = (rec.p <= rec.nominal_alpha) == (rec.decision == "reject")
        assert same, f"look {rec.look}: p {rec.p} vs nominal {rec.nominal_alpha}, decided {rec.decision}"

    # The numbers the three cases give now (the old look's are in the module docstring).
    last = res.records[-1]
    if case == "collapse_logrank":
        # Collapse censors at step 200, as the analysis has it: a clear difference at 8 seeds.
        assert last.look == 2 and last.decision == "reject" and last.p < 0.01
        km = oa.km(engine, name, cfg, by="arm").to_dict()
        assert km["groups"]["armed_gdn"]["collapses"] == 4
    elif case == "nan_fisher":
        # Censored at divergence: the 0.85 of a NaN-loss point is not read, nobody locks in.
        assert all(r.p == pytest.approx(1.0) for r in res.records) and last.decision == "accept"
    else:
        # No escape at the divergence point: no escapes at all, z = 0.
        assert all(r.statistic == 0.0 for r in res.records) and last.decision == "accept"

    # design replay on an imported copy: the same looks, from the same decision function.
    copy = tmp_path / "copy.jsonl"
    with engine.connect() as conn:
        trials = repo.sweep_trials(conn, sid)
        outcomes = repo.trial_outcomes(conn, [t[0] for t in trials])
    with copy.open("w") as fh:
        for tid, _, params, status in trials:
            if status == "skipped":
                continue
            points = trace_of(params["seed"], params["arm"])
            assert [p[0] for p in points] == [s for s, _, _ in outcomes[tid]["trace"]]
            fh.write(
                json.dumps(
                    {
                        "params": {"arm": params["arm"], "seed": params["seed"]},
                        "trace": [{"step": s, "acc": a, "loss": loss} for s, a, loss in points],
                        "status": status,
                    }
                )
                + "\n"
            )
    _cli(capsys, "import", copy, "--sweep", f"{name}_copy", "--db", db_url)
    replayed = json.loads(
        _cli(capsys, "design", "replay", spec_path, "--sweep", f"{name}_copy", "--db", db_url, "--json")
    )
    with engine.connect() as conn:
        stored = [row["record"] for row in repo.sequential_looks(conn, sid)]
    assert len(replayed) == len(stored)
    for r, s in zip(replayed, stored):
        for k in ("look", "n", "decision", "boundary", "seeds_saved"):
            assert r[k] == s[k], k
        assert r["statistic"] == pytest.approx(s["statistic"], abs=1e-9)
        assert r["p"] == pytest.approx(s["p"], abs=1e-9)
        assert r["trials_unrun"] == s["seeds_saved"]
    text_out = _cli(capsys, "design", "replay", spec_path, "--sweep", f"{name}_copy", "--db", db_url)
    assert f"replayed on sweep {name}_copy" in text_out
    engine.dispose()
