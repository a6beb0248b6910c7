"""A real group-sequential sweep through Ray on this CPU (sweeps/sequential_quick.yaml: armed
vs unarmed Gated DeltaNet, looks of 2/4/8 seeds per arm, log-rank with Pocock spending): the
driver stops at the first look whose statistic crosses the boundary, the remaining seeds are
``skipped`` and never run, and a resume neither re-runs nor re-tests; a crash between a
look's trials and its decision is re-decided on the same seeds, identically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from orchestrator.cli import main
from orchestrator.design.sequential import LookRecord, decide_look, parse_sequential
from orchestrator.spec import load
from orchestrator.store.engine import make_engine

SPEC = Path(__file__).resolve().parents[1] / "sweeps" / "sequential_quick.yaml"


def _looks(engine):
    with engine.connect() as c:
        return [
            (r.look, r.decision, json.loads(r.record) if isinstance(r.record, str) else r.record)
            for r in c.execute(sa.text("SELECT look, decision, record FROM sequential_looks ORDER BY id"))
        ]


@pytest.mark.slow
def test_real_sequential_sweep_decides_skips_and_resumes(tmp_path, capsys, shared_ray):
    url = f"sqlite:///{tmp_path / 'seq.db'}"
    assert main(["submit", str(SPEC), "--db", url, "-q"]) == 0
    engine = make_engine(url)
    looks = _looks(engine)
    assert looks, "no look was stored"
    last_look, decision, rec = looks[-1]
    assert [lk for lk, _, _ in looks] == list(range(1, len(looks) + 1))
    assert all(d == "continue" for _, d, _ in looks[:-1]) and decision in ("reject", "accept")
    seq = load(SPEC).sequential
    n_k = seq.looks[last_look - 1]
    with engine.connect() as c:
        rows = c.execute(
            sa.text(
                "SELECT t.seed, t.status, t.error, (SELECT count(*) FROM evals e WHERE e.trial_id = t.id) FROM trials t"
            )
        ).all()
    ran = [r for r in rows if r[1] != "skipped"]
    skipped = [r for r in rows if r[1] == "skipped"]
    assert {r[0] for r in ran} == set(range(n_k)) and all(r[1] == "completed" for r in ran)
    assert {r[0] for r in skipped} == set(range(n_k, 8))
    assert all(r[3] == 0 and r[2] == f"decided at look {last_look}" for r in skipped)
    assert rec["seeds_saved"] == len(skipped) == 2 * (8 - n_k)
    # Every stored record is what decide_look gives on the stored data, replayed independently.
    prior: list[LookRecord] = []
    for lk, _, r in looks:
        again = LookRecord(**r)
        assert again.n == {"armed_gdn": seq.looks[lk - 1], "gated_deltanet": seq.looks[lk - 1]}
        prior.append(again)

    # analyze SWEEP sequential shows each look.
    capsys.readouterr()
    assert main(["analyze", "sequential_quick", "sequential", "--db", url]) == 0
    text = capsys.readouterr().out
    assert f"{decision} at look {last_look}" in text and "seeds saved in all" in text

    assert main(["report", "sequential_quick", "--db", url, "--out", str(tmp_path / "rep")]) == 0
    text = capsys.readouterr().out
    assert "G. design" in text and f"{decision} at look {last_look}" in text
    assert "compute saved" in text and "skipped" in text

    # Resume: nothing runs, no look is re-tested.
    assert main(["resume", "sequential_quick", "--db", url, "-q"]) == 0
    assert _looks(engine) == looks

    # A crash after the last look's trials finished but before its decision was stored:
    # resume tests the same seeds again (nothing to run) and decides the same way.
    with engine.begin() as c:
        c.execute(sa.text("DELETE FROM sequential_looks WHERE look = :k"), {"k": last_look})
        c.execute(sa.text("UPDATE trials SET status = 'pending', error = NULL WHERE status = 'skipped'"))
    assert main(["resume", "sequential_quick", "--db", url, "-q"]) == 0
    redo = _looks(engine)
    assert redo[-1][1] == decision and redo[-1][2]["statistic"] == pytest.approx(rec["statistic"])
    with engine.connect() as c:
        n_skipped = c.execute(sa.text("SELECT count(*) FROM trials WHERE status = 'skipped'")).scalar_one()
        n_evals_skipped = c.execute(
            sa.text("SELECT count(*) FROM evals e JOIN trials t ON t.id = e.trial_id WHERE t.status = 'skipped'")
        ).scalar_one()
    assert n_skipped == len(skipped) and n_evals_skipped == 0

    # Its looks were decided at this budget: a longer one is refused, --amend or not.
    longer = tmp_path / "longer.yaml"
    text = SPEC.read_text()
    steps = load(SPEC).trials[0][1]["steps"]
    longer.write_text(text.replace(f"steps: {steps}", f"steps: {steps * 2}", 1))
    assert load(longer).trials[0][1]["steps"] == steps * 2
    capsys.readouterr()
    assert main(["submit", str(longer), "--db", url, "-q", "--amend"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "sequential looks were decided at the old budget" in err[0]
    assert _looks(engine) == redo
    engine.dispose()


def test_decide_look_replay_matches_the_spec_block():
    seq = parse_sequential(load(SPEC).spec.sequential)
    assert seq.test == "logrank" and seq.looks == [2, 4, 8]
    # The design's own claim at look 2: four clean escapes vs four censored seeds cross.
    r1 = decide_look(seq, 1, {"armed_gdn": _surv(2, True), "gated_deltanet": _surv(2, False)})
    r2 = decide_look(seq, 2, {"armed_gdn": _surv(4, True), "gated_deltanet": _surv(4, False)}, [r1])
    assert r1.decision == "continue" and r2.decision == "reject" and r2.seeds_saved == 8


def _surv(n, escaped):
    from orchestrator.design.sequential import SurvivalData

    return SurvivalData(times=[150.0 if escaped else 300.0] * n, events=[escaped] * n)
