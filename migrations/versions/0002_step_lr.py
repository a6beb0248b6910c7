"""evals.lr becomes evals.step_lr (the step's learning rate, apart from the trial's base lr
in trials.lr); the views keep their column names.

Revision ID: 0002_step_lr
Revises: 0001_initial
Create Date: 2026-11-30
"""
from alembic import op

revision = "0002_step_lr"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

# Frozen copy of trial_trace as of this revision (trial_final does not read evals.lr).
TRIAL_TRACE = """
    SELECT s.name AS sweep, t.id AS trial_id, t.key AS key, t.arm AS arm, t.task AS task,
           t.seed AS seed, t.lr AS lr, t.batch_size AS batch_size, t.status AS status,
           e.step AS step, e.acc AS acc, e.loss AS loss, e.train_loss AS train_loss,
           e.step_lr AS step_lr, e.elapsed_s AS elapsed_s, e.metrics AS metrics
    FROM evals e
    JOIN trials t ON t.id = e.trial_id
    JOIN sweeps s ON s.id = t.sweep_id
"""
TRIAL_TRACE_0001 = """
    SELECT s.name AS sweep, t.id AS trial_id, t.key AS key, t.arm AS arm, t.task AS task,
           t.seed AS seed, t.lr AS lr, t.batch_size AS batch_size, t.status AS status,
           e.step AS step, e.acc AS acc, e.loss AS loss, e.train_loss AS train_loss,
           e.lr AS step_lr, e.elapsed_s AS elapsed_s, e.metrics AS metrics
    FROM evals e
    JOIN trials t ON t.id = e.trial_id
    JOIN sweeps s ON s.id = t.sweep_id
"""


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
