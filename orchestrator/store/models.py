"""SQLAlchemy models of the result database.

The schema is created and changed only by the Alembic migrations in ``migrations/``; these
models mirror them (a test checks that autogenerate finds no difference) and are what the
code writes through. Wide typed columns for what everyone queries, JSON for the rest.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from orchestrator.evals import NUMBERS
from orchestrator.status import Status


class Base(DeclarativeBase):
    pass


class SweepRow(Base):
    """A sweep as stored (``spec.Sweep`` is a sweep as loaded from its spec)."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(sa.String(200), nullable=False, unique=True)
    spec_text: Mapped[str] = mapped_column(sa.Text, nullable=False)
    spec_hash: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    created_at: Mapped[dt.datetime] = mapped_column(
        sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )
    updated_at: Mapped[dt.datetime] = mapped_column(
        sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )
    # The lease a driver holds for an exclusive step (a design written or amended, a delete:
    # store/lease.py); times on the DB clock. Running trials is the claims' business.
    lease_owner: Mapped[str | None] = mapped_column(sa.String(64))
    lease_host: Mapped[str | None] = mapped_column(sa.String(255))
    lease_pid: Mapped[int | None] = mapped_column(sa.Integer)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    lease_renewed_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # Who made the sweep: "runner" (submit) or "import" (`orchestrator import`), set when the
    # row is made (reader.ORIGIN_RUNNER / ORIGIN_IMPORT); import writes only into its own.
    origin: Mapped[str] = mapped_column(sa.String(16), nullable=False, server_default="runner")


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (
        sa.UniqueConstraint("sweep_id", "key", name="uq_trials_sweep_key"),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'completed', 'failed', 'diverged', "
            "'interrupted', 'superseded', 'skipped')",
            name="ck_trials_status",
        ),
        sa.Index("ix_trials_sweep_status", "sweep_id", "status"),
        sa.Index("ix_trials_claimed_by", "claimed_by"),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False)
    key: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    status: Mapped[str] = mapped_column(sa.String(16), nullable=False, server_default=Status.pending.value)
    attempts: Mapped[int] = mapped_column(sa.Integer, nullable=False, server_default="0")
    # Typed copies of the parameters nearly every query filters on; the full resolved config
    # is in ``params`` and, one row per parameter, in ``trial_params``.
    arm: Mapped[str | None] = mapped_column(sa.String(64))
    task: Mapped[str | None] = mapped_column(sa.String(64))
    seed: Mapped[int | None] = mapped_column(sa.Integer)
    lr: Mapped[float | None] = mapped_column(sa.Double)
    batch_size: Mapped[int | None] = mapped_column(sa.Integer)
    steps: Mapped[int | None] = mapped_column(sa.Integer)
    eval_every: Mapped[int | None] = mapped_column(sa.Integer)
    params: Mapped[dict] = mapped_column(sa.JSON, nullable=False)
    host: Mapped[str | None] = mapped_column(sa.String(255))
    node_id: Mapped[str | None] = mapped_column(sa.String(64))
    device: Mapped[str | None] = mapped_column(sa.String(64))
    # The placement's GPU share (of one GPU; a seed pack's members split theirs) and the node
    # type's Ray accelerator (runner/fleet.py); NULL for CPU trials and where Ray cannot tell.
    gpu_fraction: Mapped[float | None] = mapped_column(sa.Double)
    accelerator: Mapped[str | None] = mapped_column(sa.String(64))
    final_step: Mapped[int | None] = mapped_column(sa.Integer)
    final_acc: Mapped[float | None] = mapped_column(sa.Double)
    final_loss: Mapped[float | None] = mapped_column(sa.Double)
    best_acc: Mapped[float | None] = mapped_column(sa.Double)
    error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[dt.datetime] = mapped_column(
        sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )
    started_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # Stamped with the database clock on every write from the trial: a heartbeat.
    updated_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # Renewed by the driver while the trial runs (reports, and the lease thread); a running
    # trial whose heartbeat is older than the lease TTL is shown as stale.
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # The sweep_specs version whose submission created this trial.
    spec_version: Mapped[int | None] = mapped_column(sa.Integer)
    # The driver (``drivers.owner``) that claimed the trial, and when the claim lapses on the
    # database clock unless its driver renews it (store/claims.py; migration 0009).
    claimed_by: Mapped[str | None] = mapped_column(sa.String(64))
    claim_expires_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))


class SpecVersion(Base):
    """Every version of a sweep's spec as submitted (``sweeps.spec_text`` is the newest)."""

    __tablename__ = "sweep_specs"
    __table_args__ = (sa.UniqueConstraint("sweep_id", "version", name="uq_sweep_specs_version"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False)
    version: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    spec_text: Mapped[str] = mapped_column(sa.Text, nullable=False)
    spec_hash: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    created_at: Mapped[dt.datetime] = mapped_column(
        sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )
    # The code difference a ``--allow-code-change`` run accepted, in one line (else NULL).
    code_change: Mapped[str | None] = mapped_column(sa.Text)


class TrialError(Base):
    """Each failed attempt of a trial: ``trials.error`` keeps one line, this the whole story."""

    __tablename__ = "trial_errors"
    __table_args__ = (sa.Index("ix_trial_errors_trial", "trial_id"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"), nullable=False)
    attempt: Mapped[int | None] = mapped_column(sa.Integer)
    kind: Mapped[str] = mapped_column(sa.String(16), nullable=False)  # config | runtime
    error: Mapped[str] = mapped_column(sa.Text, nullable=False)
    traceback: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[dt.datetime] = mapped_column(
        sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )


class TrialParam(Base):
    """One row per (trial, parameter), so any parameter is a plain SQL filter."""

    __tablename__ = "trial_params"
    __table_args__ = (sa.Index("ix_trial_params_name_num", "name", "value_num"),)

    trial_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    value_num: Mapped[float | None] = mapped_column(sa.Double)  # numbers and booleans
    value_text: Mapped[str | None] = mapped_column(sa.Text)  # strings as-is, others as JSON


class Eval(Base):
    """One eval point of one trial. Primary key (trial_id, step): rewrites are upserts.

    One DOUBLE column per number of the eval point, in its order (``orchestrator/evals.py``,
    where each is described): the table is built from ``evals.NUMBERS``, so a new number is a
    field there and a migration."""

    __table__ = sa.Table(
        "evals",
        Base.metadata,
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True, autoincrement=False),
        *(sa.Column(n, sa.Double) for n in NUMBERS),
        sa.Column("metrics", sa.JSON),
        # The values of this point that were not finite, stored as NULL above (not every
        # backend round-trips NaN/inf): "loss=nan", "loss=inf,metrics.rebind_loss=nan". NULL:
        # all finite, so a NULL number there is one that was not recorded. A diverged
        # trial's point with a finite accuracy and a NaN loss keeps its row and its accuracy
        # (migration 0006).
        sa.Column("nonfinite", sa.Text),
    )

    # Types of the attributes the code names (every column above is mapped, these or not).
    trial_id: Mapped[int]
    step: Mapped[int]
    acc: Mapped[float | None]
    loss: Mapped[float | None]
    metrics: Mapped[dict | None]
    nonfinite: Mapped[str | None]


class SequentialLook(Base):
    """One look of one group-sequential contrast (``sequential:``): what it tested and decided.

    Written once, in the same transaction that marks the decided contrast's remaining trials
    ``skipped``; a resumed sweep reads these back and never re-tests a look it has.
    """

    __tablename__ = "sequential_looks"
    __table_args__ = (sa.UniqueConstraint("sweep_id", "stratum", "look", name="uq_sequential_looks"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False)
    stratum: Mapped[str] = mapped_column(sa.String(512), nullable=False)  # JSON of the strata values
    look: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    decision: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    record: Mapped[dict] = mapped_column(sa.JSON, nullable=False)  # design.sequential.LookRecord
    created_at: Mapped[dt.datetime] = mapped_column(
        sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )


class TrialStop(Base):
    """A trial ended early by the spec's ``stop:`` rule (status stays ``completed``)."""

    __tablename__ = "trial_stops"

    trial_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(sa.Integer, nullable=False)  # the last step trained
    budget: Mapped[int] = mapped_column(sa.Integer, nullable=False)  # the steps it would have run
    reason: Mapped[str] = mapped_column(sa.String(200), nullable=False)


# The views (trial_trace, trial_final) live in the migrations only: a migration freezes its
# own copy of a view's SQL, and the models describe tables.


class KeyRename(Base):
    """A trial re-keyed by migration 0005_identity: its checkpoint file may still carry the
    old key; the runner renames it before it runs the sweep."""

    __tablename__ = "key_renames"

    sweep_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    old_key: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    new_key: Mapped[str] = mapped_column(sa.String(32), nullable=False)


class TrialCheckpoint(Base):
    """A trial's latest checkpoint (``torch.save`` bytes of ``Trainer.state_dict``), written in
    the transaction that stores the eval rows up to its ``step`` (migration 0007)."""

    __tablename__ = "trial_checkpoints"

    trial_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    attempt: Mapped[int | None] = mapped_column(sa.Integer)
    nbytes: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    state: Mapped[bytes] = mapped_column(sa.LargeBinary, nullable=False)
    created_at: Mapped[dt.datetime] = mapped_column(
        sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )


class Attempt(Base):
    """One start of a trial: the step it started from (NULL: from nothing), where it ran,
    the code and package versions that ran it, and how it ended (``outcome`` NULL while it
    runs; ``lost`` when its driver died). The view ``trial_attempts`` adds sweep and key."""

    __tablename__ = "attempts"
    __table_args__ = (sa.UniqueConstraint("trial_id", "attempt", name="uq_attempts_trial_attempt"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"), nullable=False)
    attempt: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    from_step: Mapped[int | None] = mapped_column(sa.Integer)
    driver: Mapped[str | None] = mapped_column(sa.String(255))
    host: Mapped[str | None] = mapped_column(sa.String(255))
    node_id: Mapped[str | None] = mapped_column(sa.String(64))
    device: Mapped[str | None] = mapped_column(sa.String(128))
    compute_capability: Mapped[str | None] = mapped_column(sa.String(16))
    precision: Mapped[str | None] = mapped_column(sa.String(8))
    code_version: Mapped[str | None] = mapped_column(sa.String(80))
    code_hash: Mapped[str | None] = mapped_column(sa.String(64))
    torch_version: Mapped[str | None] = mapped_column(sa.String(40))
    triton_version: Mapped[str | None] = mapped_column(sa.String(40))
    ray_version: Mapped[str | None] = mapped_column(sa.String(40))
    python_version: Mapped[str | None] = mapped_column(sa.String(40))
    orchestrator_version: Mapped[str | None] = mapped_column(sa.String(40))
    started_at: Mapped[dt.datetime] = mapped_column(
        sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )
    ended_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    outcome: Mapped[str | None] = mapped_column(sa.String(16))
    error_kind: Mapped[str | None] = mapped_column(sa.String(16))
    # The tail of what the attempt's unit wrote to stdout/stderr (migration 0011).
    log: Mapped[str | None] = mapped_column(sa.Text)
    # ``JOBID_TASKID`` of the SLURM array task whose driver ran it (migration 0012).
    slurm_job: Mapped[str | None] = mapped_column(sa.String(64))


# The attempt columns that say where and with what it ran, in the table's order: named once
# for the writer that fills them (``store.attempts.ENV_FIELDS``) and the reader that shows them.
ATTEMPT_ENV = (
    "host",
    "node_id",
    "device",
    "compute_capability",
    "precision",
    "code_version",
    "code_hash",
    "torch_version",
    "triton_version",
    "ray_version",
    "python_version",
    "orchestrator_version",
)


class Driver(Base):
    """One driver of a sweep (``submit``, ``resume`` or ``join``): it claims trials in
    batches, heartbeats them and ends (``ended_at``) when it exits (migration 0009)."""

    __tablename__ = "drivers"
    __table_args__ = (
        sa.UniqueConstraint("owner", name="uq_drivers_owner"),
        sa.Index("ix_drivers_sweep", "sweep_id"),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False)
    owner: Mapped[str] = mapped_column(sa.String(64), nullable=False)  # trials.claimed_by, attempts.driver
    host: Mapped[str | None] = mapped_column(sa.String(255))
    pid: Mapped[int | None] = mapped_column(sa.Integer)
    command: Mapped[str | None] = mapped_column(sa.String(16))  # submit | resume | join
    max_concurrent: Mapped[int | None] = mapped_column(sa.Integer)
    started_at: Mapped[dt.datetime] = mapped_column(
        sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    ended_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    end_reason: Mapped[str | None] = mapped_column(sa.String(200))
    # ``orchestrator cancel`` flags every live driver of the sweep; each stops at its renewal.
    cancel_requested_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # ``JOBID_TASKID`` when the driver is a SLURM array task (migration 0012).
    slurm_job: Mapped[str | None] = mapped_column(sa.String(64))


class SystemMetric(Base):
    """What the machine was doing at one eval step of a trial, as its worker sampled it
    (migration 0012): CPU % and RSS of the process, GPU utilisation and memory on CUDA."""

    __tablename__ = "system_metrics"

    trial_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    attempt: Mapped[int | None] = mapped_column(sa.Integer)
    elapsed_s: Mapped[float | None] = mapped_column(sa.Double)
    cpu_pct: Mapped[float | None] = mapped_column(sa.Double)
    rss_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    gpu_util_pct: Mapped[float | None] = mapped_column(sa.Double)
    gpu_mem_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    steps_per_s: Mapped[float | None] = mapped_column(sa.Double)
