"""End to end through a real Ray runtime: submit, query, failure handling, kill -9 and
resume equality, and a two-node cluster writing to PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from conftest import TINY_FIXED
from orchestrator.cli import main
from orchestrator.store.engine import make_engine


# Sweeps on the session's Ray (tests/conftest.py): none of these is about Ray's start-up.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_ray")]

SPEC = (
    "\nname: e2e\n"
    + TINY_FIXED
    + """axes:
  arm: [gated_deltanet, armed_gdn]
  lr: [1.0e-3, 3.0e-3]
  seed: 0..2
budget: {steps: 20, eval_every: 10}
resources: {cpu: 1}
max_concurrent: 2
retries: 1
"""
)


def _write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_submit_end_to_end_and_sql(db_url, tmp_path, capsys):
    spec = _write(tmp_path, SPEC)
    code = main(["submit", str(spec), "--db", db_url, "--quiet", "--checkpoint-dir", str(tmp_path / "ck")])
    assert code == 0
    capsys.readouterr()
    assert (
        main(["sql", "SELECT key, status, final_step FROM trial_final WHERE sweep = 'e2e'", "--db", db_url, "--json"])
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 12
    assert {r["status"] for r in rows} == {"completed"}
    assert {r["final_step"] for r in rows} == {20}
    assert (
        main(
            [
                "sql",
                "SELECT trial_id, step FROM trial_trace WHERE sweep = 'e2e' ORDER BY trial_id, step",
                "--db",
                db_url,
                "--json",
            ]
        )
        == 0
    )
    trace = json.loads(capsys.readouterr().out)
    assert len(trace) == 12 * 3 and {r["step"] for r in trace} == {1, 10, 20}
    # Submitting the same spec again runs nothing and duplicates nothing.
    assert main(["submit", str(spec), "--db", db_url, "--quiet", "--checkpoint-dir", str(tmp_path / "ck")]) == 0
    engine = make_engine(db_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM trials")).scalar_one() == 12
        assert conn.execute(sa.text("SELECT COUNT(*) FROM evals")).scalar_one() == 36
        hosts = conn.execute(sa.text("SELECT DISTINCT device FROM trials")).scalars().all()
        assert hosts == ["cpu (fp32)"]


# A driver killed mid-sweep and resumed (bit-identical to an uninterrupted run, SQLite and
# PostgreSQL) is tests/test_faults.py's; a sweep spread over two nodes is tests/test_cluster.py's.


def test_seed_packed_sweep_keeps_one_row_and_trace_per_member(tmp_path):
    from orchestrator.train import Trainer

    text = SPEC.replace("  lr: [1.0e-3, 3.0e-3]\n", "") + "pack_seeds: 3\n"
    spec = _write(tmp_path, text)
    db = f"sqlite:///{tmp_path / 'p.db'}"
    assert main(["submit", str(spec), "--db", db, "--quiet", "--checkpoint-dir", str(tmp_path / "ck")]) == 0
    with make_engine(db).connect() as conn:
        trials = conn.execute(sa.text("SELECT id, key, status, params FROM trials")).all()
        assert len(trials) == 6 and {t.status for t in trials} == {"completed"}
        for t in trials:
            rows = conn.execute(
                sa.text("SELECT step, acc, loss FROM evals WHERE trial_id = :i ORDER BY step"), {"i": t.id}
            ).all()
            assert [r.step for r in rows] == [1, 10, 20]
        one = trials[0]
        params = json.loads(one.params) if isinstance(one.params, str) else one.params
        rows = conn.execute(
            sa.text("SELECT step, acc, loss FROM evals WHERE trial_id = :i ORDER BY step"), {"i": one.id}
        ).all()
    lone = [(p.step, p.acc, p.loss) for p in Trainer(params).run()]
    for (s1, a1, l1), (s2, a2, l2) in zip(lone, rows):
        assert s1 == s2 and a1 == pytest.approx(a2, abs=2e-4) and l1 == pytest.approx(l2, abs=2e-4)
    assert (tmp_path / "ck" / "e2e").is_dir() and len(list((tmp_path / "ck" / "e2e").glob("*.pt"))) == 6


def test_impossible_resources_fail_before_any_write(tmp_path, capsys):
    spec = _write(tmp_path, SPEC.replace("resources: {cpu: 1}", "resources: {cpu: 1, gpu: 1}"))
    db = tmp_path / "never.db"
    assert main(["submit", str(spec), "--db", str(db), "--quiet"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err[-1].startswith("error: impossible resources: resources.gpu=1")
    assert not db.exists()
