"""Eval points with non-finite values keep their rows: ``evals.nonfinite`` names the values
of a point that were not finite (``loss=nan``, ``loss=inf,metrics.rebind_loss=nan``), which
are stored as NULL. Until this revision such a point was dropped, finite accuracy and all
(the training loop's diverged eval, an imported trace's NaN-loss points); from it on, a NULL
beside a NULL ``nonfinite`` is a value that was never recorded. The trace view shows the
column.

Existing rows keep their values: the column is nullable, and no stored point was non-finite.

(Alembic revision 0006_nonfinite, 2026-12-01.)
"""

import importlib

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0006_nonfinite", "0005_identity"

# The trace view as 0002 froze it, and this revision's copy: the same SQL with the new column
# last, so queries written against the old view keep their column positions.
TRIAL_TRACE_0002 = importlib.import_module("migrations.versions.0002_step_lr").TRIAL_TRACE
TRIAL_TRACE = TRIAL_TRACE_0002.replace(
    "e.metrics AS metrics", "e.metrics AS metrics, e.nonfinite AS nonfinite"
)
assert TRIAL_TRACE != TRIAL_TRACE_0002


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS trial_trace")
    with op.batch_alter_table("evals", recreate="never") as b:
        b.add_column(sa.Column("nonfinite", sa.Text))
    op.execute(f"CREATE VIEW trial_trace AS {TRIAL_TRACE}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS trial_trace")
    with op.batch_alter_table("evals", recreate="never") as b:
        b.drop_column("nonfinite")
    op.execute(f"CREATE VIEW trial_trace AS {TRIAL_TRACE_0002}")
