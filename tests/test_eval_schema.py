"""The eval point's one definition (orchestrator/evals.py) and everything that lists its
columns: the migrated ``evals`` table and its model, the ``trial_trace`` view, the runner's
wire form, the writer's upsert and the checkpoint trace read back, the reader's frame, the
dashboard's traces and CSV, and the JSONL import. On SQLite and PostgreSQL; a point whose
every number is distinct (and one NaN) goes through each path and comes back field for field."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import sqlalchemy as sa

from conftest import fill_sweep
from orchestrator import evals
from orchestrator.evals import EvalPoint
from orchestrator.runner.messages import EvalRow
from orchestrator.store import attempts, reader, repo
from orchestrator.store.engine import open_store_engine
from orchestrator.store.import_jsonl import INPUT_NAMES, TracePoint
from orchestrator.store.models import Eval
from orchestrator.ui import db as ui_db


def _point(step: int) -> EvalPoint:
    # Each number its own value, so a column read into the wrong field shows.
    return EvalPoint(step, acc=0.25, loss=float("nan"), train_loss=1.5, step_lr=3e-4, elapsed_s=7.0, metrics={"m": 2.0})


def test_the_lists_are_the_points_fields():
    names = [f.name for f in dataclasses.fields(EvalPoint)]
    assert list(evals.FIELDS) == names and names[0] == "step" and names[-1] == "metrics"
    assert evals.NUMBERS == tuple(names[1:-1])
    assert evals.STORED == (*evals.NUMBERS, "metrics", "nonfinite")
    assert repo.EVAL_COLUMNS == evals.STORED and repo.EVAL_NUMBERS == evals.NUMBERS
    assert reader.EVAL_COLUMNS == ("trial_id", "step", *evals.NUMBERS)
    assert ui_db.FULL_COLUMNS == (*reader.EVAL_COLUMNS, "metrics")
    assert [c.name for c in Eval.__table__.columns] == ["trial_id", "step", *evals.STORED]
    assert all(isinstance(Eval.__table__.c[n].type, sa.Double) and Eval.__table__.c[n].nullable for n in evals.NUMBERS)
    # The import's input format names each number (``lr`` for ``step_lr``), a field each, in order.
    assert INPUT_NAMES == {**{n: n for n in evals.NUMBERS}, "step_lr": "lr"}
    assert list(TracePoint.model_fields) == ["step", *INPUT_NAMES.values()]
    # What the import checks of each: settings and clocks finite, scores diverge when not.
    assert evals.FINITE_ON_IMPORT == ("step_lr", "elapsed_s")
    assert evals.DIVERGING == ("acc", "loss", "train_loss")
    assert set(evals.MEASURES) <= set(evals.NUMBERS)


def test_the_import_checks_each_number_as_evals_marks_it():
    def point(**kw):
        return TracePoint.model_validate({"step": 1, "acc": 0.5, **kw})

    for n in evals.NUMBERS:
        key = INPUT_NAMES[n]
        with pytest.raises(ValueError, match="a boolean is not a number"):
            point(**{key: True})
        if n == "acc":
            continue
        assert getattr(point(**{key: 0.25}), key) == 0.25 and getattr(point(), key) is None
        if n in evals.FINITE_ON_IMPORT:
            with pytest.raises(ValueError, match="expected a finite number"):
                point(**{key: float("inf")})
        else:
            assert point(**{key: float("nan")}).finite == (n not in evals.DIVERGING)
    assert not point(acc=float("nan")).finite and not point(acc=None).finite
    assert point(other=3.0).model_extra == {"other": 3.0}  # a key no number has: a metric


def test_wire_form_round_trips_through_json():
    row = EvalRow(4, _point(20))
    back = EvalRow.from_wire(json.loads(json.dumps(row.to_wire())))
    assert back.trial_id == 4 and back.point.step == 20 and math.isnan(back.point.loss)
    assert {n: getattr(back.point, n) for n in evals.FIELDS if n != "loss"} == {
        n: getattr(row.point, n) for n in evals.FIELDS if n != "loss"
    }


def test_a_point_comes_back_from_every_reader(db_url):
    engine, _ = open_store_engine(db_url)
    try:
        sid, ids = fill_sweep(engine, n_trials=1, n_steps=1)
        tid = next(iter(ids.values()))
        with engine.begin() as conn:
            repo.upsert_evals(conn, [EvalRow(tid, _point(50)).store_row()])
        with engine.connect() as conn:
            cols = {c["name"] for c in sa.inspect(conn).get_columns("evals")}
            view = {c["name"] for c in sa.inspect(conn).get_columns("trial_trace")}
            (trace,) = [p for p in attempts.trace_upto(conn, tid, 50) if p["step"] == 50]
        assert cols == {"trial_id", "step", *evals.STORED}
        assert set(evals.NUMBERS) <= view  # the SQL users query shows every number
        got = EvalPoint.from_dict(trace)
        assert math.isnan(got.loss) and dataclasses.replace(got, loss=0.0) == dataclasses.replace(_point(50), loss=0.0)

        frame = reader.sweep_frames(engine, "s1").evals
        row = frame[frame.step == 50].iloc[0]
        assert list(frame.columns[: len(reader.EVAL_COLUMNS)]) == list(reader.EVAL_COLUMNS)
        assert [row[n] for n in ("acc", "train_loss", "step_lr", "elapsed_s")] == [0.25, 1.5, 3e-4, 7.0]
        assert math.isnan(row["loss"]) and row["metrics.m"] == 2.0

        cols_ui = ui_db.traces(engine, "s1", full=True)["columns"]
        i = [j for j, s in enumerate(cols_ui["step"]) if s == 50][0]
        assert set(ui_db.FULL_COLUMNS) <= set(cols_ui)
        assert [cols_ui[n][i] for n in ("acc", "train_loss", "step_lr", "elapsed_s")] == [0.25, 1.5, 3e-4, 7.0]
    finally:
        engine.dispose()
