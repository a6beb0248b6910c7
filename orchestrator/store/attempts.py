"""Attempts of trials and their checkpoints (migration 0007_attempts): the runner's writes.

An attempt starts clean: the transaction that records it deletes the trial's rows past the
step it starts from, so no row of a lost attempt outlives it and no trace is stitched from two
runs. A checkpoint is written in the transaction that stores the eval rows it covers
(``runner/writer.py`` calls :func:`save_checkpoints` right after ``repo.upsert_evals``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from orchestrator.evals import NUMBERS, STORED
from orchestrator.store import dialect

from orchestrator.store.models import ATTEMPT_ENV, Attempt, Eval, SystemMetric, Trial, TrialCheckpoint

# What an attempt row records about its environment (the keys of ``begin_attempt``'s ``env``).
ENV_FIELDS = ATTEMPT_ENV
LOST = "lost"  # an attempt whose driver died before it ended


@dataclass(frozen=True)
class StoredCheckpoint:
    trial_id: int
    step: int
    state: bytes
    # The trial's stored eval rows up to ``step`` as ``EvalPoint.to_dict`` mappings, read
    # with the checkpoint (:func:`load_checkpoint`); a checkpoint holds no trace of its own.
    trace: tuple[dict[str, Any], ...] = field(default=(), compare=False)


def _open(trial_ids: Iterable[int]) -> Any:
    return sa.and_(Attempt.trial_id.in_(list(trial_ids)), Attempt.outcome.is_(None))


@dataclass(frozen=True)
class RowStart:
    """How a trial's start changes its row (``values``: the running mark, its placement)
    and whether an attempt begins with it (``begins``, from its checkpoint at ``from_step``):
    the part of a start the writer's first statement of a flush carries (``claims.hold``)."""

    values: Mapping[str, Any]
    begins: bool = False
    from_step: int | None = None


@dataclass(frozen=True)
class AttemptRead:
    """What a new attempt reads before it is recorded: the trial's last attempt number,
    whether one is still open, and whether evals, system rows or a checkpoint lie past the
    step it starts from."""

    last: int | None
    still_open: bool
    stale: tuple[bool, bool, bool]

    @classmethod
    def of(cls, row: Sequence[Any]) -> AttemptRead:
        last, still_open, *stale = row
        return cls(last, bool(still_open), (bool(stale[0]), bool(stale[1]), bool(stale[2])))


_PAST: tuple[Any, ...] = (Eval, SystemMetric, TrialCheckpoint)


def _reads(trial_id: int, start: int) -> tuple[Any, ...]:
    """The read of :class:`AttemptRead` for ``trial_id`` starting from ``start``."""
    return (
        sa.select(sa.func.max(Attempt.attempt)).where(Attempt.trial_id == trial_id).scalar_subquery(),
        sa.select(sa.func.count()).where(_open([trial_id])).scalar_subquery(),
        *(sa.exists().where(model.trial_id == trial_id, model.step > start) for model in _PAST),
    )


def start_reads(starts: Mapping[int, RowStart]) -> tuple[Any, ...]:
    """The columns of :class:`AttemptRead` for each row of ``trials`` an enclosing UPDATE
    touches: read for the trials whose attempt begins in ``starts``, NULL for the rest. Each
    trial's reads name it by value, never by the enclosing row's ``id``: SQLite writes
    RETURNING's columns unqualified, and inside a read of ``attempts`` an ``id`` is the
    attempt's own."""
    reads = {tid: _reads(tid, -1 if s.from_step is None else int(s.from_step)) for tid, s in starts.items() if s.begins}
    if not reads:
        return ()
    return tuple(sa.case(*((Trial.id == tid, r[i]) for tid, r in reads.items())) for i in range(2 + len(_PAST)))


def begin_attempt(
    conn: Connection,
    trial_id: int,
    from_step: int | None,
    env: Mapping[str, Any],
    driver: str | None,
    *,
    slurm_job: str | None = None,
    trial_values: Mapping[str, Any] | None = None,
    read: AttemptRead | None = None,
) -> int:
    """Record a new attempt of ``trial_id`` starting from its checkpoint at ``from_step``
    (None: from nothing) and delete the trial's eval rows past that step, and a checkpoint
    it did not start from, in the caller's transaction. An attempt still open (its driver
    died, or Tune restarted the unit) is closed as ``lost``. ``slurm_job``: the SLURM array
    task of the driver that runs it. ``trial_values``: changes to the trial's own row made
    by the same statement (the writer's "running" mark and placement). ``read``: what the
    attempt reads, read already by the caller's statement (``start_reads``); then only the
    attempt is recorded. Returns the attempt number."""
    start = -1 if from_step is None else int(from_step)
    if read is None:
        # One read (folded into the trial's update when there is one) says the last number,
        # whether an attempt is open and which tables hold rows past the start: most attempts
        # start fresh, with nothing to close or delete (issue 34: statements a trial).
        probe = _reads(trial_id, start)
        if trial_values:
            stmt: Any = (
                sa.update(Trial)
                .where(Trial.id == trial_id)
                .values(updated_at=sa.func.now(), **trial_values)
                .returning(*probe)
            )
        else:
            stmt = sa.select(*probe)
        read = AttemptRead.of(conn.execute(stmt).one())
    elif trial_values:
        raise ValueError("begin_attempt: trial_values with a read already made (its statement set them)")
    if read.still_open:
        close_attempts(conn, [trial_id], LOST)
    number = int(read.last or 0) + 1
    # Each value cut to its column's length (PostgreSQL refuses a longer one; SQLite would
    # keep it whole).
    values = {
        k: (str(env[k])[: getattr(Attempt.__table__.c[k].type, "length", None)] if env.get(k) is not None else None)
        for k in ENV_FIELDS
    }
    conn.execute(
        sa.insert(Attempt).values(
            trial_id=trial_id,
            attempt=number,
            from_step=from_step,
            driver=driver,
            slurm_job=slurm_job[:64] if slurm_job else None,
            **values,
        )
    )
    for model, found in zip(_PAST, read.stale):
        if found:
            conn.execute(sa.delete(model).where(model.trial_id == trial_id, model.step > start))
    return number


def close_attempts(conn: Connection, trial_ids: Iterable[int], outcome: str, error_kind: str | None = None) -> int:
    """End the open attempts of these trials with ``outcome`` (a trial status, or ``lost``)."""
    ids = list(trial_ids)
    if not ids:
        return 0
    res = conn.execute(
        sa.update(Attempt)
        .where(_open(ids))
        .values(ended_at=sa.func.now(), outcome=str(outcome)[:16], error_kind=error_kind)
    )
    return res.rowcount or 0


def save_checkpoints(
    conn: Connection, checkpoints: Sequence[StoredCheckpoint], numbers: Mapping[int, int] | None = None
) -> int:
    """Replace each trial's stored checkpoint (the caller's transaction, after the eval rows
    it covers), tagged with the trial's newest attempt (``numbers``, where the caller knows
    it: the writer began those attempts; read for the rest). Returns the bytes written."""
    if not checkpoints:
        return 0
    latest = {c.trial_id: c for c in checkpoints}  # the last of a trial wins
    known = dict(numbers or {})
    unknown = [t for t in latest if t not in known]
    if unknown:
        known.update(newest_attempts(conn, unknown))
    rows = [
        {
            "trial_id": c.trial_id,
            "step": c.step,
            "attempt": known.get(c.trial_id),
            "nbytes": len(c.state),
            "state": c.state,
        }
        for c in latest.values()
    ]
    dialect.for_connection(conn).replace(conn, TrialCheckpoint.__table__, rows, ("trial_id",), now=("created_at",))
    return sum(len(c.state) for c in latest.values())


def drop_checkpoints(conn: Connection, trial_ids: Sequence[int]) -> tuple[int, int]:
    """Delete these trials' stored checkpoints (the caller's transaction): ``keep_checkpoints:
    none`` with a trial's end, and ``orchestrator db prune``. Returns (rows, bytes) freed."""
    if not trial_ids:
        return 0, 0
    where = TrialCheckpoint.trial_id.in_(list(trial_ids))
    rows, nbytes = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(TrialCheckpoint.nbytes), 0)).where(where)
    ).one()
    conn.execute(sa.delete(TrialCheckpoint).where(where))
    return int(rows), int(nbytes)


def save_logs(conn: Connection, logs: Mapping[int, str]) -> None:
    """Each trial's newest attempt gets ``logs[trial_id]``, the tail of its unit's console
    (replacing what an earlier report of the same attempt stored)."""
    for tid, text in logs.items():
        newest = sa.select(sa.func.max(Attempt.attempt)).where(Attempt.trial_id == tid).scalar_subquery()
        conn.execute(sa.update(Attempt).where(Attempt.trial_id == tid, Attempt.attempt == newest).values(log=text))


def checkpoint_steps(conn: Connection, trial_ids: Sequence[int]) -> dict[int, int]:
    """trial id -> the step of its stored checkpoint (trials without one left out)."""
    if not trial_ids:
        return {}
    rows = conn.execute(
        sa.select(TrialCheckpoint.trial_id, TrialCheckpoint.step).where(TrialCheckpoint.trial_id.in_(list(trial_ids)))
    )
    return {int(r.trial_id): int(r.step) for r in rows}


def load_checkpoint(conn: Connection, trial_id: int) -> StoredCheckpoint | None:
    """The trial's checkpoint and, in the same transaction, its eval rows up to the
    checkpoint's step (the trace a resumed trial continues; rows past it are a lost
    attempt's, which the resuming attempt deletes). The rows were committed with or before
    the checkpoint, and only the attempt this load starts deletes any at or below its step."""
    row = conn.execute(
        sa.select(TrialCheckpoint.step, TrialCheckpoint.state).where(TrialCheckpoint.trial_id == trial_id)
    ).first()
    if row is None:
        return None
    step = int(row.step)
    return StoredCheckpoint(trial_id, step, bytes(row.state), tuple(trace_upto(conn, trial_id, step)))


def trace_upto(conn: Connection, trial_id: int, step: int) -> list[dict[str, Any]]:
    """The trial's eval rows with ``step`` at most ``step``, in step order, as the training
    loop's points (``EvalPoint.to_dict``): the values ``repo.upsert_evals`` stored as NULL
    and named in ``nonfinite`` are given back as the NaN or infinity they were."""
    rows = conn.execute(
        sa.select(Eval.step, *(Eval.__table__.c[c] for c in STORED))
        .where(Eval.trial_id == trial_id, Eval.step <= step)
        .order_by(Eval.step)
    )
    out = []
    for r in rows:
        metrics = r.metrics if isinstance(r.metrics, dict) or r.metrics is None else json.loads(r.metrics)
        point: dict[str, Any] = {"step": int(r.step), **{c: r._mapping[c] for c in NUMBERS}}
        point["metrics"] = dict(metrics or {})
        for mark in (r.nonfinite or "").split(","):
            path, eq, value = mark.rpartition("=")
            if not eq:
                continue
            head, dot, name = path.partition(".")
            if dot and head == "metrics":
                point["metrics"][name] = float(value)
            elif path in point:
                point[path] = float(value)
        out.append(point)
    return out


def newest_attempts(conn: Connection, trial_ids: Sequence[int]) -> dict[int, int]:
    """Each trial's newest attempt number (the one a report the writer stores belongs to)."""
    return dict(
        conn.execute(
            sa.select(Attempt.trial_id, sa.func.max(Attempt.attempt))
            .where(Attempt.trial_id.in_(list(trial_ids)))
            .group_by(Attempt.trial_id)
        ).all()
    )
