"""Sweep lifecycle: a lease on each sweep (owner, host, pid, expiry on the database clock),
a cancel request, a heartbeat per trial, a table of full error tracebacks, the versions of
each sweep's spec (and the version that created each trial), and two more trial statuses
(``interrupted``, ``superseded``) in the status check.

Existing rows keep their values: every new column is nullable, widening the check admits
every status that was valid before, and each existing sweep's stored spec becomes its
version 1, which is recorded as the creator of its existing trials.

(Alembic revision 0003_lifecycle, 2026-11-30.)
"""
import sqlalchemy as sa
from alembic import op

revision, down_revision = "0003_lifecycle", "0002_step_lr"

OLD_CHECK = "status IN ('pending', 'running', 'completed', 'failed', 'diverged')"
NEW_CHECK = ("status IN ('pending', 'running', 'completed', 'failed', 'diverged', "
             "'interrupted', 'superseded')")


def _replace_check_sqlite(old: str, new: str) -> None:
    # SQLite cannot alter a CHECK in place, and rebuilding `trials` (batch mode) would drop
    # the table under foreign_keys=ON, cascading a DELETE into evals and trial_params. The
    # SQLite manual's documented procedure for changing a CHECK constraint edits the stored
    # CREATE TABLE text instead (https://www.sqlite.org/lang_altertable.html section 7);
    # widening it cannot invalidate a stored row.
    bind = op.get_bind()
    sql = bind.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'trials'").scalar_one()
    assert old in sql, "trials' status check is not the one this revision expects"
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    bind.exec_driver_sql("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'trials'",
                         (sql.replace(old, new),))
    bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    bind.exec_driver_sql("PRAGMA writable_schema = OFF")


def _replace_check(old: str, new: str) -> None:
    if op.get_bind().dialect.name == "sqlite":
        _replace_check_sqlite(old, new)
    else:
        op.drop_constraint("ck_trials_status", "trials", type_="check")
        op.create_check_constraint("ck_trials_status", "trials", new)


def upgrade() -> None:
    with op.batch_alter_table("sweeps", recreate="never") as b:
        b.add_column(sa.Column("lease_owner", sa.String(64)))
        b.add_column(sa.Column("lease_host", sa.String(255)))
        b.add_column(sa.Column("lease_pid", sa.Integer))
        b.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True)))
        b.add_column(sa.Column("lease_renewed_at", sa.DateTime(timezone=True)))
        b.add_column(sa.Column("cancel_requested_at", sa.DateTime(timezone=True)))
    with op.batch_alter_table("trials", recreate="never") as b:
        b.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True)))
    _replace_check(OLD_CHECK, NEW_CHECK)
    op.create_table(
        "trial_errors",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("attempt", sa.Integer),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("traceback", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
    )
    op.create_index("ix_trial_errors_trial", "trial_errors", ["trial_id"])
    op.create_table(
        "sweep_specs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("sweep_id", sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("spec_text", sa.Text, nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
        sa.UniqueConstraint("sweep_id", "version", name="uq_sweep_specs_version"),
    )
    with op.batch_alter_table("trials", recreate="never") as b:
        b.add_column(sa.Column("spec_version", sa.Integer))
    op.execute("INSERT INTO sweep_specs (sweep_id, version, spec_text, spec_hash, created_at) "
               "SELECT id, 1, spec_text, spec_hash, created_at FROM sweeps")
    op.execute("UPDATE trials SET spec_version = 1")


def downgrade() -> None:
    with op.batch_alter_table("trials", recreate="never") as b:
        b.drop_column("spec_version")
    op.drop_table("sweep_specs")
    op.drop_index("ix_trial_errors_trial", table_name="trial_errors")
    op.drop_table("trial_errors")
    # Statuses the old check does not know go back to what a 0002 resume makes of them.
    op.execute("UPDATE trials SET status = 'pending' WHERE status IN ('interrupted', 'superseded')")
    _replace_check(NEW_CHECK, OLD_CHECK)
    with op.batch_alter_table("trials", recreate="never") as b:
        b.drop_column("heartbeat_at")
    with op.batch_alter_table("sweeps", recreate="never") as b:
        for col in ("cancel_requested_at", "lease_renewed_at", "lease_expires_at", "lease_pid",
                    "lease_host", "lease_owner"):
            b.drop_column(col)
