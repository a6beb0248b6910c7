"""0004_designs on SQLite and PostgreSQL: a database at 0002 keeps its trials and evals through
the upgrade (the status check is widened in place, not by rebuilding ``trials``), ``skipped``
is accepted afterwards and a made-up status still is not, and the downgrade puts skipped
trials back to pending."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from conftest import migrate, old_database
from orchestrator.store.engine import current_revision


def test_designs_migration_keeps_data_and_widens_the_status_check(db_url):
    engine = old_database(
        db_url,
        "0002_step_lr",
        "INSERT INTO trials (sweep_id, key, params, status) VALUES "
        "(1, 'a', '{}', 'completed'), (1, 'b', '{}', 'pending')",
        "INSERT INTO evals (trial_id, step, acc) VALUES (1, 1, 0.5), (1, 2, 0.9)",
    )
    with engine.begin() as conn:
        with pytest.raises(sa.exc.IntegrityError):
            with conn.begin_nested():
                conn.execute(sa.text("UPDATE trials SET status = 'skipped' WHERE key = 'b'"))
    migrate(engine, "0004_designs")
    assert current_revision(engine) == "0004_designs"
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE trials SET status = 'skipped' WHERE key = 'b'"))
        with pytest.raises(sa.exc.IntegrityError):
            with conn.begin_nested():
                conn.execute(sa.text("UPDATE trials SET status = 'bogus' WHERE key = 'a'"))
        conn.execute(
            sa.text(
                "INSERT INTO sequential_looks (sweep_id, stratum, look, decision, record) "
                "VALUES (1, '{}', 1, 'continue', '{}')"
            )
        )
        conn.execute(sa.text("INSERT INTO trial_stops (trial_id, step, budget, reason) VALUES (1, 2, 10, 'r')"))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM evals")).scalar_one() == 2
        assert dict(conn.execute(sa.text("SELECT key, status FROM trials")).all()) == {"a": "completed", "b": "skipped"}
        assert conn.execute(sa.text("SELECT count(*) FROM trial_stops")).scalar_one() == 1
    migrate(engine, "0002_step_lr", down=True)
    with engine.connect() as conn:
        assert dict(conn.execute(sa.text("SELECT key, status FROM trials")).all()) == {"a": "completed", "b": "pending"}
        assert conn.execute(sa.text("SELECT count(*) FROM evals")).scalar_one() == 2
        assert "sequential_looks" not in sa.inspect(conn).get_table_names()
    engine.dispose()
