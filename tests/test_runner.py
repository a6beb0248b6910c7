"""End to end through a real Ray runtime: submit, query, failure handling, kill -9 and
resume equality, and a two-node cluster writing to PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from orchestrator.cli import main
from orchestrator.store.engine import make_engine

from conftest import POSTGRES_URL, make_pg_schema_url, two_arm_spec

pytestmark = pytest.mark.slow

SPEC = """
name: e2e
fixed:
  task: mqar
  task.K: 8
  task.eval_size: 64
  d_model: 16
  n_layers: 1
  batch_size: 16
axes:
  arm: [gated_deltanet, armed_gdn]
  lr: [1.0e-3, 3.0e-3]
  seed: 0..2
budget: {steps: 20, eval_every: 10}
resources: {cpu: 1}
max_concurrent: 2
retries: 1
"""


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


KILL_SPEC = two_arm_spec("killme")


def _evals(url):
    with make_engine(url).connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT t.key, e.step, e.acc, e.loss, e.train_loss, e.step_lr FROM evals e "
                "JOIN trials t ON t.id = e.trial_id ORDER BY t.key, e.step"
            )
        ).all()


def _count(url, q):
    try:
        with make_engine(url).connect() as conn:
            return conn.execute(sa.text(q)).scalar_one()
    except Exception:
        return 0


def _kill_and_resume(tmp_path, url_ref, url_kill):
    spec = _write(tmp_path, KILL_SPEC)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "orchestrator.cli"]
    ref = subprocess.run(
        cli + ["submit", str(spec), "--db", url_ref, "--quiet", "--checkpoint-dir", str(tmp_path / "ck_ref")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ref.returncode == 0, ref.stderr
    proc = subprocess.Popen(
        cli + ["submit", str(spec), "--db", url_kill, "--quiet", "--checkpoint-dir", str(tmp_path / "ck_kill")],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    # Kill once some trial is mid-way: its trace has started but not finished.
    while time.time() < deadline:
        mid = _count(
            url_kill,
            "SELECT COUNT(*) FROM trials t WHERE status = 'running' AND "
            "(SELECT MAX(step) FROM evals e WHERE e.trial_id = t.id) BETWEEN 40 AND 200",
        )
        if mid:
            break
        time.sleep(0.2)
    assert mid, "no trial was caught mid-way"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    before = _count(url_kill, "SELECT COUNT(*) FROM trials WHERE status = 'completed'")
    assert before < 6
    res = subprocess.run(
        cli + ["resume", "killme", "--db", url_kill, "--quiet", "--checkpoint-dir", str(tmp_path / "ck_kill")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    assert _count(url_kill, "SELECT COUNT(*) FROM trials WHERE status = 'completed'") == 6
    a, b = _evals(url_ref), _evals(url_kill)
    assert len(a) == 6 * 13
    assert a == b  # row for row, bit for bit on CPU


def test_kill9_and_resume_equals_uninterrupted_sqlite(tmp_path):
    _kill_and_resume(tmp_path, f"sqlite:///{tmp_path / 'ref.db'}", f"sqlite:///{tmp_path / 'kill.db'}")


@pytest.mark.skipif(not POSTGRES_URL, reason="ORCH_TEST_POSTGRES_URL not set")
def test_kill9_and_resume_equals_uninterrupted_postgres(tmp_path):
    url_ref, drop_ref = make_pg_schema_url()
    url_kill, drop_kill = make_pg_schema_url()
    try:
        _kill_and_resume(tmp_path, url_ref, url_kill)
    finally:
        drop_ref()
        drop_kill()


@pytest.mark.skipif(not POSTGRES_URL, reason="ORCH_TEST_POSTGRES_URL not set")
def test_two_node_cluster_places_trials_on_both_nodes(tmp_path):
    from ray.cluster_utils import Cluster

    from orchestrator import spec as specs
    from orchestrator.runner.sweep import submit

    url, drop = make_pg_schema_url()
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        text = SPEC.replace("budget: {steps: 20, eval_every: 10}", "budget: {steps: 60, eval_every: 20}")
        sweep = specs.load(_write(tmp_path, text))
        summary = submit(sweep, db=url, address=cluster.address, checkpoint_dir=str(tmp_path / "ck"))
        assert summary.outcomes == {"completed": 12}
        with make_engine(url).connect() as conn:
            nodes = conn.execute(sa.text("SELECT DISTINCT node_id FROM trials")).scalars().all()
        assert len(nodes) == 2 and None not in nodes
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
        drop()


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
