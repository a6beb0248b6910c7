"""One coordination protocol: the columns nothing reads any more go.

- ``sweeps.cancel_requested_at``: ``orchestrator cancel`` flags each live driver's row
  (``drivers.cancel_requested_at``, which every driver, the lease's holder among them, reads
  at its renewal); the sweep-level flag was written and never acted on.
- ``drivers.exclusive``: never written (a sequential design's looks are decided once under
  the claims, not by a driver holding the sweep alone).

The sweep's lease (``sweeps.lease_*``) stays, for the exclusive steps only: a design written
or amended, a delete. A downgrade adds both columns back, empty (NULL and false).

(Alembic revision 0013_one_protocol, 2026-12-02.)
"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0013_one_protocol", "0012_system_slurm"


def upgrade() -> None:
    # SQLite 3.35+ drops a column in place (neither is indexed, keyed or in a view).
    with op.batch_alter_table("sweeps", recreate="never") as b:
        b.drop_column("cancel_requested_at")
    with op.batch_alter_table("drivers", recreate="never") as b:
        b.drop_column("exclusive")


def downgrade() -> None:
    with op.batch_alter_table("drivers", recreate="never") as b:
        b.add_column(sa.Column("exclusive", sa.Boolean, nullable=False, server_default=sa.false()))
    with op.batch_alter_table("sweeps", recreate="never") as b:
        b.add_column(sa.Column("cancel_requested_at", sa.DateTime(timezone=True)))
