"""What the machine was doing, and which SLURM job a driver was.

- ``system_metrics``: one row per trial and eval step, sampled by the trial's worker at
  the eval cadence: the process's CPU % and resident memory, on CUDA the device's
  utilisation and memory (``nvidia-ml-py``; NULL on the CPU), and the steps per second
  since the previous eval. Keyed like ``evals`` (a retried attempt rewrites its steps) and
  tagged with the attempt that measured it.
- ``drivers.slurm_job`` and ``attempts.slurm_job``: ``JOBID_TASKID`` of a SLURM array task
  (``orchestrator slurm``), as ``squeue`` prints it; NULL outside SLURM.

Existing rows keep NULL: nothing was measured before this revision.

(Alembic revision 0012_system_slurm, 2026-12-02.)
"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0012_system_slurm", "0011_attempt_logs"


def upgrade() -> None:
    op.create_table(
        "system_metrics",
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("attempt", sa.Integer),
        sa.Column("elapsed_s", sa.Double),
        sa.Column("cpu_pct", sa.Double),
        sa.Column("rss_bytes", sa.BigInteger),
        sa.Column("gpu_util_pct", sa.Double),
        sa.Column("gpu_mem_bytes", sa.BigInteger),
        sa.Column("steps_per_s", sa.Double),
    )
    with op.batch_alter_table("drivers", recreate="never") as b:
        b.add_column(sa.Column("slurm_job", sa.String(64)))
    with op.batch_alter_table("attempts", recreate="never") as b:
        b.add_column(sa.Column("slurm_job", sa.String(64)))


def downgrade() -> None:
    with op.batch_alter_table("attempts", recreate="never") as b:
        b.drop_column("slurm_job")
    with op.batch_alter_table("drivers", recreate="never") as b:
        b.drop_column("slurm_job")
    op.drop_table("system_metrics")
