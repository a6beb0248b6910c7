"""Each attempt's console: ``attempts.log``.

- ``attempts.log``: the last part (``$ORCH_LOG_TAIL_KIB`` KiB, default 64) of what the
  attempt's unit wrote to stdout and stderr, updated while it runs and at its end, so a
  failing trial's page, ``orchestrator logs`` and ``status --trial`` show what it printed.

Existing rows keep NULL: nothing was captured before this revision.

(Alembic revision 0011_attempt_logs, 2026-12-02.)
"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0011_attempt_logs", "0010_sweep_origin"


def upgrade() -> None:
    with op.batch_alter_table("attempts", recreate="never") as b:
        b.add_column(sa.Column("log", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("attempts", recreate="never") as b:
        b.drop_column("log")
