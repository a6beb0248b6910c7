"""The eval rows' upsert on every backend (a real SQLite file, the real PostgreSQL): a batch
of new rows goes in by the bulk path, one that re-sends stored rows replaces them (never a
duplicate), in a later transaction or in the same one, and a re-sent batch leaves the rest
of its transaction as it was. Non-finite values are stored as NULL and named, whichever
path built the row. On PostgreSQL each test runs both ways a batch can go: a small one as
one multi-row INSERT ... ON CONFLICT, a large one by COPY under a savepoint."""

from __future__ import annotations

import json
import math

import pytest
import sqlalchemy as sa

from orchestrator.store import dialect, repo
from orchestrator.store.engine import open_store_engine


@pytest.fixture(autouse=True, params=["small", "copy"])
def batch_path(request, monkeypatch):
    """Which PostgreSQL path every batch of the test takes (SQLite has one)."""
    if request.param == "copy":
        monkeypatch.setattr(dialect.PostgreSQL, "SMALL_BATCH", 0)
    return request.param


def _setup(db_url: str) -> tuple[sa.Engine, int, int]:
    engine, _ = open_store_engine(db_url)
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, "s", "name: s\n", "h")
        ids = repo.add_trials(conn, sid, [("a", {"seed": 0}), ("b", {"seed": 1})])
    return engine, ids["a"], ids["b"]


def _stored(engine: sa.Engine) -> dict[tuple[int, int], tuple]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT trial_id, step, acc, loss, metrics, nonfinite FROM evals")).all()
    out = {}
    for t, s, acc, loss, metrics, nonfinite in rows:
        metrics = json.loads(metrics) if isinstance(metrics, str) else metrics
        out[(t, s)] = (acc, loss, metrics, nonfinite)
    return out


def test_resent_rows_replace_and_new_ones_are_added(db_url):
    engine, a, b = _setup(db_url)
    first = [{"trial_id": t, "step": s, "acc": 0.1, "loss": 1.0} for t in (a, b) for s in (1, 10, 20)]
    with engine.begin() as conn:
        assert repo.upsert_evals(conn, first) == 6
    # A later flush re-sends two stored rows (new values, one gone non-finite) beside new ones.
    again = [
        {"trial_id": a, "step": 10, "acc": 0.5, "loss": math.inf, "metrics": {"rebind_acc": 0.25}},
        {"trial_id": b, "step": 20, "acc": 0.7, "loss": 0.3},
        {"trial_id": a, "step": 30, "acc": 0.9, "loss": 0.2, "metrics": {"rebind_acc": math.nan}},
    ]
    with engine.begin() as conn:
        assert repo.upsert_evals(conn, again) == 3
    got = _stored(engine)
    assert len(got) == 7
    assert got[(a, 10)] == (0.5, None, {"rebind_acc": 0.25}, "loss=inf")
    assert got[(b, 20)] == (0.7, 0.3, None, None)
    assert got[(a, 30)] == (0.9, 0.2, {"rebind_acc": None}, "metrics.rebind_acc=nan")
    assert got[(a, 1)] == got[(b, 1)] == (0.1, 1.0, None, None)
    engine.dispose()


def test_a_resent_batch_in_the_same_transaction_replaces_and_keeps_the_rest(db_url):
    engine, a, b = _setup(db_url)
    with engine.begin() as conn:
        repo.upsert_evals(conn, [{"trial_id": a, "step": s, "acc": 0.1} for s in (1, 2)])
        repo.upsert_evals(conn, [{"trial_id": b, "step": 1, "acc": 0.2}])
        # Re-sends a row written earlier in this transaction; the last report of a
        # (trial, step) within one batch wins.
        n = repo.upsert_evals(
            conn,
            [
                {"trial_id": a, "step": 2, "acc": 0.3},
                {"trial_id": a, "step": 3, "acc": 0.4},
                {"trial_id": a, "step": 3, "acc": 0.6},
            ],
        )
        assert n == 2
        # and once more, so a second replacing upsert in one transaction sees only its own rows
        repo.upsert_evals(conn, [{"trial_id": a, "step": 1, "acc": 0.8}])
    got = {k: v[0] for k, v in _stored(engine).items()}
    assert got == {(a, 1): 0.8, (a, 2): 0.3, (a, 3): 0.6, (b, 1): 0.2}
    engine.dispose()


def test_a_row_for_a_missing_trial_is_refused_and_nothing_of_its_batch_stays(db_url):
    engine, a, _ = _setup(db_url)
    # The store writes through the driver's own cursor: the driver's integrity error.
    with pytest.raises(Exception, match="(?i)foreign key") as info:
        with engine.begin() as conn:
            repo.upsert_evals(conn, [{"trial_id": a, "step": 1, "acc": 0.1}, {"trial_id": 9999, "step": 1, "acc": 0.1}])
    assert "IntegrityError" in {c.__name__ for c in type(info.value).__mro__}
    assert _stored(engine) == {}
    engine.dispose()


def test_non_finite_values_are_named_whichever_path_builds_the_row():
    finite = repo.eval_tuple({"trial_id": "3", "step": 7, "acc": 1, "loss": 0.0, "metrics": {"b": 2.0, "a": [1, 0.5]}})
    assert finite == (3, 7, 1.0, 0.0, None, None, None, '{"a": [1, 0.5], "b": 2.0}', None)
    assert all(type(x) is float for x in finite[2:4])
    marked = repo.eval_tuple(
        {
            "trial_id": 3,
            "step": 8,
            "acc": 0.5,
            "train_loss": -math.inf,
            "metrics": {"b": {"c": math.nan}, "a": [1.0, math.inf]},
        }
    )
    assert marked == (
        3,
        8,
        0.5,
        None,
        None,
        None,
        None,
        '{"a": [1.0, null], "b": {"c": null}}',
        "train_loss=-inf,metrics.b.c=nan,metrics.a[1]=inf",
    )
