"""The training loop keeps an eval point whose loss is non-finite but whose accuracy is
finite (it used to drop it, finite accuracy and all), and the store keeps it: loss NULL,
the point named non-finite in ``evals.nonfinite``; a non-finite metric is stored as null
(PostgreSQL's json refuses the NaN token). Migration 0006 adds the column to a database
that has rows."""

from __future__ import annotations

import json
import math

import sqlalchemy as sa
import torch

from conftest import TINY_TRIAL, migrate, old_database
from orchestrator.runner.messages import EvalRow
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.train import Trainer

BASE = {**TINY_TRIAL, "seed": 1, "rebinding": True}


class EvalLossOverflows(Trainer):
    """A real trial whose held-out loss overflows at step 10 while its accuracy, scored on
    the same logits, stays a number (as when a few targets get probability 0)."""

    def _evaluate(self, step, lr):
        point = super()._evaluate(step, lr)
        if step == 10:
            point.loss = math.inf
            point.metrics["rebind_loss"] = math.nan
        return point


def test_the_loop_keeps_the_point_that_went_non_finite(db_url, tmp_path):
    tr = EvalLossOverflows(BASE)
    trace = list(tr.run())
    assert [p.step for p in trace] == [1, 10] and [p.step for p in tr.trace] == [1, 10]
    assert tr.status == "diverged" and tr.error == "non-finite eval loss at step 10"
    assert 0.0 <= trace[-1].acc <= 1.0 and trace[-1].loss == math.inf
    # A checkpoint taken now holds the point, so a resumed trial re-reports it.
    path = tmp_path / "ck.pt"
    torch.save(tr.state_dict(), path)
    again = Trainer(BASE)
    again.load_state_dict(torch.load(path, weights_only=False))
    assert [p.step for p in again.trace] == [1, 10] and again.status == "diverged"
    assert list(again.run()) == []
    # What the runner reports is what the store keeps.
    engine, _ = open_store_engine(db_url)
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, "s", "name: s\n", "h")
        tid = repo.add_trials(conn, sid, [("k", BASE)])["k"]
        assert repo.upsert_evals(conn, [EvalRow(tid, p).store_row() for p in again.trace]) == 2
        repo.finish_trial(conn, tid, tr.status.value, tr.error)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT step, acc, loss, metrics, nonfinite FROM evals ORDER BY step")).all()
        final = conn.execute(sa.text("SELECT final_step, final_acc, final_loss, best_acc FROM trials")).one()
    (s1, acc1, loss1, m1, nf1), (s10, acc10, loss10, m10, nf10) = rows
    m10 = m10 if isinstance(m10, dict) else json.loads(m10)
    assert (s1, nf1) == (1, None) and math.isfinite(loss1) and acc1 == trace[0].acc
    assert (s10, acc10, loss10) == (10, trace[-1].acc, None)
    assert nf10 == "loss=inf,metrics.rebind_loss=nan" and m10["rebind_loss"] is None
    assert m10["rebind_acc"] == trace[-1].metrics["rebind_acc"]
    assert tuple(final) == (10, trace[-1].acc, None, max(acc1, acc10))


def test_upgrading_a_0005_database_adds_the_column_and_keeps_rows(db_url):
    from orchestrator.store.engine import head_revision, current_revision

    engine = old_database(db_url, "0005_identity")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO trials (sweep_id, key, params) VALUES (1, 'k', '{}')"))
        conn.execute(sa.text("INSERT INTO evals (trial_id, step, acc, loss) VALUES (1, 1, 0.5, 2.0)"))
    migrate(engine, "head")
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        got = conn.execute(sa.text("SELECT step, acc, loss, nonfinite FROM trial_trace")).all()
    assert [tuple(r) for r in got] == [(1, 0.5, 2.0, None)]
    migrate(engine, "0005_identity", down=True)
    with engine.connect() as conn:
        cols = [c["name"] for c in sa.inspect(conn).get_columns("evals")]
        assert "nonfinite" not in cols
        assert conn.execute(sa.text("SELECT step, acc FROM trial_trace")).all() == [(1, 0.5)]


def test_the_writers_tuple_from_a_point_is_the_tuple_from_its_mapping():
    """``repo.point_tuple`` (the writer's fast path, read off the point) builds what
    ``repo.eval_tuple`` builds from the row's mapping, for finite rows, ints, a missing
    train loss and every kind of non-finite number or metric."""
    from orchestrator.evals import EvalPoint

    points = [
        EvalPoint(10, 0.5, 1.25, 2.0, 1e-3, 3.5, {"rebind_acc": 0.25}),
        EvalPoint(20, 1, 2, None, 0.001, 4, {}),
        EvalPoint(30, 0.5, math.inf, -math.inf, 1e-3, 5.0, {"rebind_loss": math.nan, "deep": {"x": math.inf}}),
        EvalPoint(40, math.nan, 1.0, 2.0, 1e-3, 6.0, {"ok": 1.0}),
        EvalPoint(50, 0.0, 0.0, 0.0, 0.0, 0.0, {"bad": math.nan}),
    ]
    for p in points:
        got, want = repo.point_tuple(7, p), repo.eval_tuple(EvalRow(7, p).store_row())
        assert repr(got) == repr(want), (got, want)  # repr: a NaN is never equal to itself
    assert repo.point_tuple(7, points[2])[-1] == "loss=inf,train_loss=-inf,metrics.rebind_loss=nan,metrics.deep.x=inf"
    assert repo.point_tuple(7, points[0])[-1] is None
