"""Initial schema: sweeps, trials, trial_params, evals and the trace/final views.

(Alembic revision 0001_initial, 2026-11-29.)
"""
import sqlalchemy as sa
from alembic import op

revision, down_revision = "0001_initial", None

# Frozen copies of the view SQL as of this revision: later revisions that change a view
# drop and recreate it with their own copy, never by importing the live models.
TRIAL_TRACE = """
    SELECT s.name AS sweep, t.id AS trial_id, t.key AS key, t.arm AS arm, t.task AS task,
           t.seed AS seed, t.lr AS lr, t.batch_size AS batch_size, t.status AS status,
           e.step AS step, e.acc AS acc, e.loss AS loss, e.train_loss AS train_loss,
           e.lr AS step_lr, e.elapsed_s AS elapsed_s, e.metrics AS metrics
    FROM evals e
    JOIN trials t ON t.id = e.trial_id
    JOIN sweeps s ON s.id = t.sweep_id
"""
TRIAL_FINAL = """
    SELECT s.name AS sweep, t.id AS trial_id, t.key AS key, t.arm AS arm, t.task AS task,
           t.seed AS seed, t.lr AS lr, t.batch_size AS batch_size, t.steps AS steps,
           t.status AS status, e.step AS final_step, e.acc AS final_acc,
           e.loss AS final_loss,
           (SELECT MAX(e3.acc) FROM evals e3 WHERE e3.trial_id = t.id) AS best_acc,
           t.params AS params
    FROM trials t
    JOIN sweeps s ON s.id = t.sweep_id
    LEFT JOIN evals e ON e.trial_id = t.id
         AND e.step = (SELECT MAX(e2.step) FROM evals e2 WHERE e2.trial_id = t.id)
"""


def upgrade() -> None:
    now = sa.func.now()
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("spec_text", sa.Text, nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
    )
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("sweep_id", sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("key", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("arm", sa.String(64)),
        sa.Column("task", sa.String(64)),
        sa.Column("seed", sa.Integer),
        sa.Column("lr", sa.Double),
        sa.Column("batch_size", sa.Integer),
        sa.Column("steps", sa.Integer),
        sa.Column("eval_every", sa.Integer),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("host", sa.String(255)),
        sa.Column("node_id", sa.String(64)),
        sa.Column("device", sa.String(64)),
        sa.Column("final_step", sa.Integer),
        sa.Column("final_acc", sa.Double),
        sa.Column("final_loss", sa.Double),
        sa.Column("best_acc", sa.Double),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("updated_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("sweep_id", "key", name="uq_trials_sweep_key"),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'completed', 'failed', 'diverged')",
            name="ck_trials_status"),
    )
    op.create_index("ix_trials_sweep_status", "trials", ["sweep_id", "status"])
    op.create_table(
        "trial_params",
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("value_num", sa.Double),
        sa.Column("value_text", sa.Text),
    )
    op.create_index("ix_trial_params_name_num", "trial_params", ["name", "value_num"])
    op.create_table(
        "evals",
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("acc", sa.Double),
        sa.Column("loss", sa.Double),
        sa.Column("train_loss", sa.Double),
        sa.Column("lr", sa.Double),
        sa.Column("elapsed_s", sa.Double),
        sa.Column("metrics", sa.JSON),
    )
    op.execute(f"CREATE VIEW trial_trace AS {TRIAL_TRACE}")
    op.execute(f"CREATE VIEW trial_final AS {TRIAL_FINAL}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS trial_final")
    op.execute("DROP VIEW IF EXISTS trial_trace")
    op.drop_table("evals")
    op.drop_index("ix_trial_params_name_num", table_name="trial_params")
    op.drop_table("trial_params")
    op.drop_index("ix_trials_sweep_status", table_name="trials")
    op.drop_table("trials")
    op.drop_table("sweeps")
