"""The columnar eval read (``read_evals(..., columnar=True)``: Arrow's SQLite driver through
``Dialect.fetch_arrays``, what the dashboard's child processes read a big sweep with) against
the reference, the tuple read through the sqlite3 module: the same frame, dtypes included, on
the rows that trip a driver that types columns from its first rows (more than a first batch
of NULL accuracies, non-finite marks, a NULL loss far in), for a range of trial ids, for a
sweep beside another, and for a sweep without evals. PostgreSQL has no columnar driver here:
the same call reads tuples there and the frame is the same.

Real parts: real SQLite files written as ``bench ui`` writes them, the real PostgreSQL server."""

from __future__ import annotations

import pandas as pd
import pytest
import sqlalchemy as sa

from orchestrator.analysis.data import EVAL_DTYPES, read_evals
from orchestrator.bench.ui import build_db_fast
from orchestrator.errors import UserError
from orchestrator.store import dialect, repo
from orchestrator.store.engine import open_store_engine
from orchestrator.store.reader import eval_point_arrays, open_reader_engine, sweep_id, trial_id_bounds

N_TRIALS, N_EVALS = 60, 30
# More NULL accuracies at the start of the read than ADBC's first batch (1,024 rows).
NULL_TRIALS = 45


def _build(url: str) -> None:
    build_db_fast(url, N_TRIALS, N_EVALS, sweep="a", seed=1)
    build_db_fast(url, 20, N_EVALS, sweep="b", seed=2)
    engine, _ = open_store_engine(url)
    try:
        with engine.begin() as conn:
            repo.upsert_sweep(conn, "empty", "# a sweep with no trials yet\n", "empty")
            sid = conn.execute(sa.text("SELECT id FROM sweeps WHERE name = 'a'")).scalar_one()
            ids = [
                r[0] for r in conn.execute(sa.text("SELECT id FROM trials WHERE sweep_id = :s ORDER BY id"), {"s": sid})
            ]
            # A trace the writer stored as non-finite: NULL, with the mark that says what it was.
            conn.execute(
                sa.text(
                    'UPDATE evals SET acc = NULL, nonfinite = \'{"acc": "nan"}\' '
                    f"WHERE trial_id IN ({','.join(map(str, ids[:NULL_TRIALS]))})"
                )
            )
            conn.execute(
                sa.text(
                    'UPDATE evals SET loss = NULL, nonfinite = \'{"loss": "inf"}\' WHERE trial_id = :t AND step > 5'
                ),
                {"t": ids[-1]},
            )
            conn.execute(sa.text("UPDATE evals SET acc = 1 WHERE trial_id = :t"), {"t": ids[-2]})
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def sqlite_engine(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('columnar') / 'columnar.db'}"
    _build(url)
    engine, _ = open_reader_engine(url)
    yield engine
    engine.dispose()


def test_the_columnar_read_is_the_tuple_read(sqlite_engine):
    with sqlite_engine.connect() as c:
        arrays = eval_point_arrays(c, sweep_id(c, "a"), EVAL_DTYPES)
    assert arrays is not None  # Arrow's driver read it: this is not the tuple path again
    assert len(arrays["trial_id"]) == N_TRIALS * N_EVALS
    got, want = read_evals(sqlite_engine, "a", columnar=True), read_evals(sqlite_engine, "a")
    pd.testing.assert_frame_equal(got, want)
    assert want["acc"].isna().sum() == NULL_TRIALS * N_EVALS
    late = int(want["loss"].isna().sum())  # one trial's loss past its fifth step, the read's last rows
    assert 0 < late < N_EVALS and want["loss"].isna().to_numpy()[-late:].all()
    assert int(want["nonfinite"].sum()) == NULL_TRIALS * N_EVALS + late
    assert list(got.dtypes) == [pd.api.types.pandas_dtype(t) for t in EVAL_DTYPES.values()]


def test_ranges_and_a_sweep_beside_another_read_alike(sqlite_engine):
    with sqlite_engine.connect() as c:
        bounds = trial_id_bounds(c, sweep_id(c, "a"), 3)
    assert bounds[-1][1] is None  # the last range is open: sweep b's trials lie above it
    for r in bounds:
        got, want = read_evals(sqlite_engine, "a", r, columnar=True), read_evals(sqlite_engine, "a", r)
        pd.testing.assert_frame_equal(got, want)
        assert len(got) == N_TRIALS * N_EVALS // 3
    pd.testing.assert_frame_equal(read_evals(sqlite_engine, "b", columnar=True), read_evals(sqlite_engine, "b"))


def test_a_sweep_without_evals_is_the_same_empty_frame(sqlite_engine):
    got, want = read_evals(sqlite_engine, "empty", columnar=True), read_evals(sqlite_engine, "empty")
    assert got.empty
    pd.testing.assert_frame_equal(got, want)


def test_a_missing_file_is_a_user_error_and_is_not_created(tmp_path):
    missing = tmp_path / "missing.db"
    with pytest.raises(UserError, match="no database"):
        dialect.for_url(f"sqlite:///{missing}").fetch_arrays(f"sqlite:///{missing}", "SELECT 1 AS x", {"x": int})
    assert not missing.exists()


def test_the_driver_opens_the_file_read_only(sqlite_engine, monkeypatch):
    """The URI the read opens refuses a write through the same driver."""
    from adbc_driver_sqlite import dbapi as adbc

    opened: list[str] = []
    real = adbc.connect
    monkeypatch.setattr(adbc, "connect", lambda uri, *a, **k: opened.append(uri) or real(uri, *a, **k))
    read_evals(sqlite_engine, "a", columnar=True)
    assert len(opened) == 1
    conn = real(opened[0])
    try:
        cur = conn.cursor()
        with pytest.raises(Exception, match="readonly"):
            cur.execute("UPDATE evals SET acc = 0.5")
            conn.commit()
        cur.close()
    finally:
        conn.close()
    assert read_evals(sqlite_engine, "a")["acc"].ne(0.5).any()


def test_each_backend_gives_the_reference_frame(db_url):
    """SQLite through Arrow, PostgreSQL (no columnar driver here: ``fetch_arrays`` is None)
    through tuples: ``columnar=True`` is the reference frame on both."""
    _build(db_url)
    engine, _ = open_reader_engine(db_url)
    try:
        with engine.connect() as c:
            arrays = eval_point_arrays(c, sweep_id(c, "a"), EVAL_DTYPES)
        assert (arrays is None) == (not db_url.startswith("sqlite"))
        pd.testing.assert_frame_equal(read_evals(engine, "a", columnar=True), read_evals(engine, "a"))
    finally:
        engine.dispose()
