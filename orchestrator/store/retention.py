"""What a sweep keeps stored, and giving back what it no longer needs (``orchestrator db prune``).

A sweep's bulk is its checkpoints (model and optimizer state, ``trial_checkpoints.nbytes``
each), not its eval rows. ``keep_checkpoints: none`` deletes a trial's checkpoint with its end;
with the default ``final`` a finished trial keeps one, so a longer budget continues it, until
``prune`` deletes those of a finished sweep. A trial extended after a prune has nothing to
continue from and trains again from step 0 (its rows are replaced; the run is deterministic,
so the trace is the one it had, then goes on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from orchestrator.errors import UserError
from orchestrator.status import FINISHED, Status
from orchestrator.store import attempts, claims, dialect, lease, reader
from orchestrator.store.models import Eval, Trial, TrialCheckpoint

# The estimate of one eval row's bytes beyond its text: trial id, step and five numbers, 8
# bytes each (pages, row headers and the primary-key index are not counted, so it is a floor).
ROW_FIXED_BYTES = 56


def stored_size(conn: Connection, sweep: int) -> dict[str, int]:
    """The sweep's eval rows and checkpoints: ``eval_rows``, ``eval_bytes`` (an estimate:
    :data:`ROW_FIXED_BYTES` a row plus the length of its metrics and nonfinite text),
    ``checkpoints`` and ``checkpoint_bytes`` (the stored blobs' ``nbytes``, exact)."""
    tids = sa.select(Trial.id).where(Trial.sweep_id == sweep).scalar_subquery()
    text = sa.func.coalesce(sa.func.length(sa.cast(Eval.metrics, sa.Text)), 0) + sa.func.coalesce(
        sa.func.length(Eval.nonfinite), 0
    )
    rows, text_bytes = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(text), 0)).where(Eval.trial_id.in_(tids))
    ).one()
    ckpts, ckpt_bytes = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(TrialCheckpoint.nbytes), 0)).where(
            TrialCheckpoint.trial_id.in_(tids)
        )
    ).one()
    return {
        "eval_rows": int(rows),
        "eval_bytes": int(rows) * ROW_FIXED_BYTES + int(text_bytes),
        "checkpoints": int(ckpts),
        "checkpoint_bytes": int(ckpt_bytes),
    }


def size_line(size: dict[str, Any]) -> str:
    """``stored: N eval rows (X MB), M checkpoints (Y MB)`` (MB = 10**6 bytes)."""
    return (
        f"stored: {size['eval_rows']:,} eval rows ({size['eval_bytes'] / 1e6:.2f} MB), "
        f"{size['checkpoints']:,} checkpoints ({size['checkpoint_bytes'] / 1e6:.2f} MB)"
    )


@dataclass(frozen=True)
class Pruned:
    sweep: str
    checkpoints: int  # rows deleted (or that would be, with dry_run)
    nbytes: int  # their stored bytes
    dry_run: bool


def _unfinished(conn: Connection, sweep: int) -> str | None:
    """Why the sweep is not finished (a live driver, or trials still to run), or None."""
    held = lease.holder(conn, sweep)
    if held is not None and not held.expired:
        return f"it is being run by {held.summary()}"
    live = claims.drivers(conn, sweep, ttl=lease.lease_ttl_s(), live_only=True)
    if live:
        return f"it is being run by {live[0].summary()}"
    waiting = conn.execute(
        sa.select(Trial.status, sa.func.count())
        .where(Trial.sweep_id == sweep, Trial.status.in_([Status.pending.value, Status.running.value]))
        .group_by(Trial.status)
    ).all()
    if waiting:
        return "it has " + " and ".join(f"{n} {status} trial(s)" for status, n in sorted(waiting))
    return None


def prune(engine: Engine, name: str, *, dry_run: bool = False) -> Pruned:
    """Delete the checkpoints of the finished (completed or diverged) trials of the finished
    sweep ``name``, in one transaction that first takes the claim lock, so no driver claims a
    trial between the check and the delete. Failed, interrupted and superseded trials keep
    theirs (a resume or a revival continues from them). Raises UserError, changing nothing,
    on an unknown sweep or one with a live driver or pending or running trials."""
    with engine.begin() as conn:
        dialect.for_connection(conn).lock_for_claim(conn)
        sid = reader.sweep_id(conn, name)
        why = _unfinished(conn, sid)
        if why is not None:
            raise UserError(f"sweep {name!r} is not finished ({why}): nothing pruned")
        tids = [
            int(t)
            for t in conn.execute(
                sa.select(TrialCheckpoint.trial_id)
                .join(Trial, Trial.id == TrialCheckpoint.trial_id)
                .where(Trial.sweep_id == sid, Trial.status.in_([s.value for s in FINISHED]))
            ).scalars()
        ]
        if dry_run:
            n, nbytes = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(TrialCheckpoint.nbytes), 0)).where(
                    TrialCheckpoint.trial_id.in_(tids)
                )
            ).one()
            return Pruned(name, int(n), int(nbytes), True)
        n, nbytes = attempts.drop_checkpoints(conn, tids)
    return Pruned(name, n, nbytes, False)


def require_vacuum(engine: Engine) -> None:
    """UserError unless the backend can :func:`vacuum` (checked before anything is pruned)."""
    with engine.connect() as conn:
        if not dialect.for_connection(conn).vacuums:
            raise UserError("--vacuum is for a SQLite file: PostgreSQL's autovacuum makes the freed space reusable")


def vacuum(engine: Engine) -> int:
    """Give a SQLite file's free pages back (VACUUM); returns the bytes the file shrank by."""
    require_vacuum(engine)
    with engine.connect() as conn:
        d = dialect.for_connection(conn)
        before = d.database_bytes(conn)
    d.vacuum(engine)
    with engine.connect() as conn:
        return before - d.database_bytes(conn)
