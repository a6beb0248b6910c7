"""Designs: group-sequential looks (``sequential_looks``), early stops (``trial_stops``), and
the ``skipped`` trial status (a seed a decided contrast never ran).

The status check is widened from whatever set it holds now (read from the database), so this
revision applies on top of any revision that widened it before.

(Alembic revision 0004_designs, 2026-11-30.)
"""
import re

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0004_designs", "0003_lifecycle"

ADDED = "skipped"


def _check_sql(statuses: list[str]) -> str:
    return "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


def _current_statuses() -> list[str]:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        sql = bind.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'trials'").scalar_one()
        m = re.search(r"status IN \(([^)]*)\)", sql)
    else:
        sql = bind.exec_driver_sql(
            "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid "
            "WHERE c.conname = 'ck_trials_status' AND t.relname = 'trials' "
            "AND t.relnamespace = to_regnamespace(current_schema())").scalar_one()
        m = re.search(r"(.*)", sql)
    assert m is not None, "trials has no status check this revision recognises"
    return re.findall(r"'([a-z_]+)'", m.group(1))


def _replace_check(old: list[str], new: list[str]) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        op.drop_constraint("ck_trials_status", "trials", type_="check")
        op.create_check_constraint("ck_trials_status", "trials", _check_sql(new))
        return
    # SQLite cannot alter a CHECK, and rebuilding `trials` would drop it under foreign_keys=ON
    # (cascading into evals). The SQLite manual's procedure for a CHECK change edits the stored
    # CREATE TABLE text (https://www.sqlite.org/lang_altertable.html section 7).
    sql = bind.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'trials'").scalar_one()
    sql = re.sub(r"status IN \([^)]*\)", _check_sql(new), sql, count=1)
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    bind.exec_driver_sql("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'trials'",
                         (sql,))
    bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    bind.exec_driver_sql("PRAGMA writable_schema = OFF")


def upgrade() -> None:
    old = _current_statuses()
    if ADDED not in old:
        _replace_check(old, old + [ADDED])
    op.create_table(
        "sequential_looks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("sweep_id", sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("stratum", sa.String(512), nullable=False),
        sa.Column("look", sa.Integer, nullable=False),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("record", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
        sa.UniqueConstraint("sweep_id", "stratum", "look", name="uq_sequential_looks"),
    )
    op.create_table(
        "trial_stops",
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("budget", sa.Integer, nullable=False),
        sa.Column("reason", sa.String(200), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("trial_stops")
    op.drop_table("sequential_looks")
    # Skipped trials were never run: back to pending, which every older revision admits.
    op.execute(f"UPDATE trials SET status = 'pending' WHERE status = '{ADDED}'")
    old = _current_statuses()
    _replace_check(old, [s for s in old if s != ADDED])
