"""Checkpoints through the store and one row per attempt of a trial.

- ``trial_checkpoints``: each trial's latest checkpoint (one row per trial, a seed pack's
  members each their own), written by the driver's writer in the transaction that stores the
  eval rows it covers, so a sweep resumes on any machine that reaches the database.
- ``attempts``: one row per start of a trial (the step it started from, where it ran, which
  code and package versions, how it ended); the view ``trial_attempts`` names its sweep and key.
- ``sweep_specs.code_change``: the one-line code difference a ``--allow-code-change`` run
  accepted (NULL for an ordinary version).

Existing rows keep their values: the tables start empty and the column is nullable. A
sweep whose checkpoints are files keeps resuming from them.

(Alembic revision 0007_attempts, 2026-12-01.)
"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0007_attempts", "0006_nonfinite"

TRIAL_ATTEMPTS = """
SELECT s.name AS sweep, t.key AS key, a.attempt AS attempt, a.from_step AS from_step,
       a.driver AS driver, a.host AS host, a.node_id AS node_id, a.device AS device,
       a.compute_capability AS compute_capability, a.precision AS precision,
       a.code_version AS code_version, a.code_hash AS code_hash,
       a.torch_version AS torch_version, a.triton_version AS triton_version,
       a.ray_version AS ray_version, a.python_version AS python_version,
       a.orchestrator_version AS orchestrator_version,
       a.started_at AS started_at, a.ended_at AS ended_at, a.outcome AS outcome,
       a.error_kind AS error_kind, a.trial_id AS trial_id
FROM attempts a
JOIN trials t ON t.id = a.trial_id
JOIN sweeps s ON s.id = t.sweep_id
"""


def upgrade() -> None:
    op.create_table(
        "trial_checkpoints",
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer),
        sa.Column("nbytes", sa.Integer, nullable=False),
        sa.Column("state", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("from_step", sa.Integer),
        sa.Column("driver", sa.String(255)),
        sa.Column("host", sa.String(255)),
        sa.Column("node_id", sa.String(64)),
        sa.Column("device", sa.String(128)),
        sa.Column("compute_capability", sa.String(16)),
        sa.Column("precision", sa.String(8)),
        sa.Column("code_version", sa.String(80)),
        sa.Column("code_hash", sa.String(64)),
        sa.Column("torch_version", sa.String(40)),
        sa.Column("triton_version", sa.String(40)),
        sa.Column("ray_version", sa.String(40)),
        sa.Column("python_version", sa.String(40)),
        sa.Column("orchestrator_version", sa.String(40)),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("ended_at", sa.DateTime(timezone=True)),
        sa.Column("outcome", sa.String(16)),
        sa.Column("error_kind", sa.String(16)),
        sa.UniqueConstraint("trial_id", "attempt", name="uq_attempts_trial_attempt"),
    )
    with op.batch_alter_table("sweep_specs", recreate="never") as b:
        b.add_column(sa.Column("code_change", sa.Text))
    op.execute(f"CREATE VIEW trial_attempts AS {TRIAL_ATTEMPTS}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS trial_attempts")
    with op.batch_alter_table("sweep_specs", recreate="never") as b:
        b.drop_column("code_change")
    op.drop_table("attempts")
    op.drop_table("trial_checkpoints")
