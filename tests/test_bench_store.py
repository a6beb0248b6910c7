"""`bench store`'s ingest: the writer's path and the backend's bulk load of the same rows, on
every backend (a real SQLite file, the real PostgreSQL)."""

from __future__ import annotations

import sqlalchemy as sa

from orchestrator.bench import store as b


def test_ingest_puts_the_writer_beside_the_bulk_load(db_url):
    got = b.ingest(db_url, n_rows=4000)
    # the writer's path kept its guarantees: every row stored once, the NaN losses marked
    assert got["rows"] == got["stored"] == 4000
    assert got["nonfinite_marked"] == 40
    assert got["ceiling"] == ("COPY" if db_url.startswith("postgresql") else "executemany, one transaction")
    assert got["rows_per_s"] > 0 and got["batch"] == 2000
    # the like-for-like ceiling (foreign key, the writer's batches) and the other three forms
    for form in ("", "_no_fk", "_one_go", "_one_go_no_fk"):
        assert got[f"ceiling{form}_rows_per_s"] > 0
        assert abs(got[f"share_of_ceiling{form}"] - got["rows_per_s"] / got[f"ceiling{form}_rows_per_s"]) < 1e-9
    # the ceiling's scratch table is gone; evals hold the writer's rows only
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        assert "evals_ceiling" not in sa.inspect(conn).get_table_names()
        assert conn.execute(sa.text("SELECT COUNT(*) FROM evals")).scalar_one() == 4000
    engine.dispose()


def test_best_of_takes_each_timing_from_its_fastest_round(tmp_path):
    got = b.ingest(f"sqlite:///{tmp_path / 'a.db'}", n_rows=2000)
    slow_writer = {**got, "seconds": 2 * got["seconds"], "rows_per_s": got["rows_per_s"] / 2}
    slow_ceiling = {**got, "ceiling_seconds": 3 * got["ceiling_seconds"]}
    best = b.best_of([slow_writer, slow_ceiling])
    assert best["rounds"] == 2 and best["writer_rows_per_s_rounds"] == [got["rows_per_s"] / 2, got["rows_per_s"]]
    assert best["seconds"] == got["seconds"] and best["ceiling_seconds"] == got["ceiling_seconds"]
    assert abs(best["share_of_ceiling"] - got["share_of_ceiling"]) < 1e-9
    assert abs(best["ceiling_one_go_rows_per_s"] - got["ceiling_one_go_rows_per_s"]) < 1e-6
