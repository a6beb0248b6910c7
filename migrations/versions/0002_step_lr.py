"""evals.lr becomes evals.step_lr (the step's learning rate, apart from the trial's base lr
in trials.lr); the views keep their column names.

(Alembic revision 0002_step_lr, 2026-11-30.)
"""
import importlib

from alembic import op

revision, down_revision = "0002_step_lr", "0001_initial"

# The trace view as 0001 froze it, and this revision's copy: the same SQL reading the renamed
# column under the view's old name.
TRIAL_TRACE_0001 = importlib.import_module("migrations.versions.0001_initial").TRIAL_TRACE
TRIAL_TRACE = TRIAL_TRACE_0001.replace("e.lr AS step_lr", "e.step_lr AS step_lr")
assert TRIAL_TRACE != TRIAL_TRACE_0001


def upgrade() -> None:
    # The view reads the column: drop it around the rename (SQLite >= 3.25 and PostgreSQL
    # both rename a column in place, keeping the data).
    op.execute("DROP VIEW IF EXISTS trial_trace")
    op.execute("ALTER TABLE evals RENAME COLUMN lr TO step_lr")
    op.execute(f"CREATE VIEW trial_trace AS {TRIAL_TRACE}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS trial_trace")
    op.execute("ALTER TABLE evals RENAME COLUMN step_lr TO lr")
    op.execute(f"CREATE VIEW trial_trace AS {TRIAL_TRACE_0001}")
