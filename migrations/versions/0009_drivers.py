"""Many drivers on one sweep: a row per driver and a claim on each trial.

- ``drivers``: every driver that ran a sweep (``submit``, ``resume``, ``join``): its owner
  token, host and pid, when it started, its last heartbeat and when and why it ended (NULL
  while it runs), its ``max_concurrent``, whether it held the sweep exclusively (a sequential
  design), and a cancel request addressed to it (``orchestrator cancel`` flags every live
  driver; a driver started after the cancel is not flagged).
- ``trials.claimed_by`` / ``trials.claim_expires_at``: the driver (its owner token) that
  claimed the trial and when the claim lapses on the database clock unless renewed. A trial
  with a live claim is run by that driver and no other; a lapsed claim is free to take.

Existing rows keep their values: the table starts empty and the columns are nullable (no
trial is claimed).

(Alembic revision 0009_drivers, 2026-12-01.)
"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0009_drivers", "0008_fleet_placement"


def upgrade() -> None:
    op.create_table(
        "drivers",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("sweep_id", sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("host", sa.String(255)),
        sa.Column("pid", sa.Integer),
        sa.Column("command", sa.String(16)),
        sa.Column("max_concurrent", sa.Integer),
        sa.Column("exclusive", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True)),
        sa.Column("ended_at", sa.DateTime(timezone=True)),
        sa.Column("end_reason", sa.String(200)),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("owner", name="uq_drivers_owner"),
    )
    op.create_index("ix_drivers_sweep", "drivers", ["sweep_id"])
    with op.batch_alter_table("trials", recreate="never") as b:
        b.add_column(sa.Column("claimed_by", sa.String(64)))
        b.add_column(sa.Column("claim_expires_at", sa.DateTime(timezone=True)))
    op.create_index("ix_trials_claimed_by", "trials", ["claimed_by"])


def downgrade() -> None:
    op.drop_index("ix_trials_claimed_by", table_name="trials")
    with op.batch_alter_table("trials", recreate="never") as b:
        b.drop_column("claim_expires_at")
        b.drop_column("claimed_by")
    op.drop_index("ix_drivers_sweep", table_name="drivers")
    op.drop_table("drivers")
