"""Many drivers on one sweep: each driver's row and its claims on trials (migration 0009).

A driver (``submit``, ``resume`` or ``join``) registers a row in ``drivers``, then claims
trials in batches: one transaction picks free trials (no claim, or a claim whose expiry has
passed on the database clock), locks them (PostgreSQL ``FOR UPDATE SKIP LOCKED``; SQLite
``BEGIN IMMEDIATE``: the differences are :meth:`Dialect.lock_for_claim` and
:meth:`Dialect.skip_locked`) and stamps them with its owner token and an expiry. Its renewal
thread extends its claims and its own heartbeat every ``ttl / 4`` seconds; at exit it
releases what it still holds. A driver that dies stops renewing: after the TTL its claims
lapse and any other driver takes the trials over (their open attempts end ``lost``). A
trial with a live claim runs nowhere but at its claimant.

``orchestrator cancel`` flags every live driver of the sweep (``drivers.cancel_requested_at``);
each reads its own flag at its next renewal and stops. ``--takeover`` ends every other live
driver (``ended_at``, reason ``taken over``) and frees its claims; that driver sees it at its
next renewal and stops without touching the trials.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from orchestrator.status import Status
from orchestrator.store import attempts, dialect, lease
from orchestrator.store.models import Driver, SweepRow, Trial

# Statuses a claim can pick: never run, stopped, or left running by a driver that is gone.
# ``failed`` is not among them: only ``submit``/``resume`` give a failed trial another go
# (``repo.release_unfinished``), so drivers never pass a failing trial around for ever.
CLAIMABLE = (Status.pending.value, Status.interrupted.value, Status.running.value)
TAKEN_OVER = "taken over"


def _live_claim(d: dialect.Dialect) -> Any:
    return sa.and_(Trial.claimed_by.is_not(None), Trial.claim_expires_at >= d.now_plus(0))


def free(conn: Connection) -> Any:
    """SQL: a trial nobody holds (no claim, or one that lapsed)."""
    return sa.not_(_live_claim(dialect.for_connection(conn)))


def _live_driver(d: dialect.Dialect, ttl: float) -> Any:
    return sa.and_(Driver.ended_at.is_(None), Driver.heartbeat_at >= d.now_plus(-ttl))


# ---- a driver's row ---------------------------------------------------------------------------


def register(
    conn: Connection,
    sweep: int,
    owner: str,
    *,
    command: str,
    max_concurrent: int | None = None,
    slurm_job: str | None = None,
) -> int:
    """Record a driver starting on ``sweep`` (``slurm_job``: the SLURM array task it is);
    returns its id."""
    d = dialect.for_connection(conn)
    return conn.execute(
        sa.insert(Driver)
        .values(
            sweep_id=sweep,
            owner=owner,
            host=socket.gethostname()[:255],
            pid=os.getpid(),
            command=command[:16],
            max_concurrent=max_concurrent,
            slurm_job=slurm_job[:64] if slurm_job else None,
            heartbeat_at=d.now_plus(0),
        )
        .returning(Driver.id)
    ).scalar_one()


@dataclass(frozen=True)
class Renewal:
    alive: bool  # False: another driver ended this one (``--takeover``)
    cancel: bool  # ``orchestrator cancel`` flagged it
    lost: tuple[int, ...]  # trials it runs whose claim another driver holds now


def renew(conn: Connection, owner: str, *, ttl: float, running: list[int] | tuple[int, ...] = ()) -> Renewal:
    """Extend the driver's claims and its heartbeat (and heartbeat the trials it runs).
    Three statements a renewal (a fourth only when a running trial is no longer held): it
    runs every TTL/4 in every driver, and on SQLite each statement holds the write lock."""
    d = dialect.for_connection(conn)
    me = conn.execute(
        sa.update(Driver)
        .where(Driver.owner == owner, Driver.ended_at.is_(None))
        .values(heartbeat_at=d.now_plus(0))
        .returning(Driver.cancel_requested_at)
    ).first()
    if me is None:
        return Renewal(False, False, ())
    conn.execute(sa.update(Trial).where(Trial.claimed_by == owner).values(claim_expires_at=d.now_plus(ttl)))
    ids = list(running)
    lost: tuple[int, ...] = ()
    # Only those it still holds: a trial another driver took over (or has ended and let go)
    # while this one was cut off is not this driver's to keep alive.
    held = lease.heartbeat(conn, ids, held_by=owner)
    gone = [t for t in ids if t not in held]
    if gone:
        elsewhere = set(
            conn.execute(
                sa.select(Trial.id).where(Trial.id.in_(gone), Trial.claimed_by.is_not(None), Trial.claimed_by != owner)
            ).scalars()
        )
        lost = tuple(t for t in gone if t in elsewhere)
    return Renewal(True, me[0] is not None, lost)


def interrupt(
    conn: Connection, *, owner: str | None = None, sweep: int | None = None, trial_ids: Collection[int] | None = None
) -> int:
    """The one way ``running`` trials become ``interrupted`` (their open attempts end so
    too): a stopping driver's (``owner``: those it claimed), a sweep's left behind with no
    live driver (``sweep``: ``orchestrator cancel``), or the trials Tune stopped before their
    end (``trial_ids``). A resume continues each from its checkpoint. Returns how many."""
    stmt = sa.select(Trial.id).where(Trial.status == Status.running.value)
    if owner is not None:
        stmt = stmt.where(Trial.claimed_by == owner)
    if sweep is not None:
        stmt = stmt.where(Trial.sweep_id == sweep)
    if trial_ids is not None:
        stmt = stmt.where(Trial.id.in_(list(trial_ids)))
    ids = list(conn.execute(stmt).scalars())
    if ids:
        attempts.close_attempts(conn, ids, Status.interrupted.value)
        conn.execute(
            sa.update(Trial).where(Trial.id.in_(ids)).values(status=Status.interrupted.value, updated_at=sa.func.now())
        )
    return len(ids)


def end(conn: Connection, owner: str, reason: str | None) -> None:
    """The driver exits: every claim it holds is released and its row is ended."""
    conn.execute(sa.update(Trial).where(Trial.claimed_by == owner).values(claimed_by=None, claim_expires_at=None))
    conn.execute(
        sa.update(Driver)
        .where(Driver.owner == owner, Driver.ended_at.is_(None))
        .values(ended_at=sa.func.now(), end_reason=(reason or "finished")[:200])
    )


def reap_dead(conn: Connection, sweep: int, *, alive: Callable[[int], bool]) -> int:
    """End the sweep's drivers on this host whose process is gone (``alive(pid)`` False) and
    free their claims at once: a SIGKILLed driver's trials need not wait out the TTL when
    its successor runs on the same machine. Returns how many."""
    d = dialect.for_connection(conn)
    rows = conn.execute(
        sa.select(Driver.owner, Driver.pid).where(
            Driver.sweep_id == sweep,
            Driver.ended_at.is_(None),
            Driver.host == socket.gethostname()[:255],
            Driver.pid != os.getpid(),
        )
    ).all()
    dead = [r.owner for r in rows if r.pid and not alive(r.pid)]
    if dead:
        conn.execute(sa.update(Trial).where(Trial.claimed_by.in_(dead)).values(claim_expires_at=d.now_plus(-1)))
        conn.execute(sa.update(Driver).where(Driver.owner.in_(dead)).values(ended_at=sa.func.now(), end_reason="died"))
    return len(dead)


def take_over(conn: Connection, sweep: int, owner: str, ttl: float) -> int:
    """``--takeover``: end every other live driver of the sweep and free its claims (its
    running trials are taken over as a dead driver's would be). Returns how many."""
    d = dialect.for_connection(conn)
    others = list(
        conn.execute(
            sa.select(Driver.owner).where(Driver.sweep_id == sweep, Driver.owner != owner, Driver.ended_at.is_(None))
        ).scalars()
    )
    if not others:
        return 0
    live = conn.execute(sa.select(sa.func.count()).where(Driver.owner.in_(others), _live_driver(d, ttl))).scalar_one()
    conn.execute(sa.update(Trial).where(Trial.claimed_by.in_(others)).values(claim_expires_at=d.now_plus(-1)))
    conn.execute(
        sa.update(Driver).where(Driver.owner.in_(others)).values(ended_at=sa.func.now(), end_reason=TAKEN_OVER)
    )
    return int(live)


# ---- claims -------------------------------------------------------------------------------------


def claim_batch(
    conn: Connection,
    sweep: int,
    owner: str,
    n: int,
    *,
    ttl: float,
    gate: Callable[[Connection], Collection[int] | None] | None = None,
) -> list[tuple[int, str, dict]] | None:
    """Claim up to ``n`` free trials of the sweep for ``owner`` in the caller's transaction
    (fresh: on SQLite this begins it with the write lock; or the writer's flush, which took
    that lock with its ownership check, ``taken_from``); (id, key, params) in
    insertion order, or None while another driver holds the sweep's lease for an exclusive
    step (a design being written). A trial a dead driver left ``running`` goes back to
    ``pending`` and its open attempt ends ``lost``.

    ``gate`` (a sequential design's looks: runner/sequential.LookGate) is called with the
    sweep held by this transaction alone (its row locked on PostgreSQL; SQLite's write lock)
    and may write; it returns the trials that may run now (None: none ever again), and only
    those are claimed."""
    d = dialect.for_connection(conn)
    d.lock_for_claim(conn)
    exclusive = sa.exists().where(
        SweepRow.id == sweep,
        SweepRow.lease_owner.is_not(None),
        SweepRow.lease_owner != owner,
        SweepRow.lease_expires_at >= d.now_plus(0),
    )

    def excluded() -> bool:
        return bool(conn.execute(sa.select(exclusive)).scalar())

    only = None
    if gate is not None:  # the gate may write: the lease is read first
        conn.execute(sa.select(SweepRow.id).where(SweepRow.id == sweep).with_for_update())
        if excluded():
            return None
        only = gate(conn)
        if not only:
            return []
    if n <= 0:
        return None if excluded() else []
    # Never its own: a trial this driver holds is queued or running here, even when its claim
    # lapsed because the renewal was starved (a loaded machine) and nobody took it meanwhile.
    # Taken as a dead driver's "orphan" it went back to pending while it ran here, and a stop
    # then found nothing to mark interrupted (the likeliest way CI once saw a cancel leave 0
    # interrupted and 4 pending).
    mine = sa.and_(Trial.claimed_by.is_not(None), Trial.claimed_by == owner)
    where = [Trial.sweep_id == sweep, Trial.status.in_(CLAIMABLE), sa.not_(_live_claim(d)), sa.not_(mine)]
    if only is not None:
        where.append(Trial.id.in_(list(only)))
    else:  # the lease read in the pick: a statement saved on every claim (issue 34)
        where.append(sa.not_(exclusive))
    # The pick and the claim are one statement (issue 34: statements a trial), the queue's
    # ``UPDATE ... WHERE id IN (SELECT ... LIMIT n [FOR UPDATE SKIP LOCKED]) RETURNING``; the
    # pick is not correlated with the outer ``trials`` (it reads the table on its own).
    pick = d.skip_locked(sa.select(Trial.id).where(*where).order_by(Trial.id).limit(n)).correlate(None)
    claim = (
        sa.update(Trial)
        .where(Trial.id.in_(pick.scalar_subquery()))
        .values(claimed_by=owner, claim_expires_at=d.now_plus(ttl))
        .returning(Trial.id, Trial.key, Trial.params, Trial.status)
    )
    rows = sorted(conn.execute(claim).all(), key=lambda r: r.id)  # RETURNING keeps no order
    if not rows:
        return None if only is None and excluded() else []
    orphans = [r.id for r in rows if r.status == Status.running.value]
    if orphans:
        attempts.close_attempts(conn, orphans, attempts.LOST)
        conn.execute(
            sa.update(Trial).where(Trial.id.in_(orphans)).values(status=Status.pending.value, updated_at=sa.func.now())
        )
    return [(r.id, r.key, r.params) for r in rows]


def release(conn: Connection, owner: str, trial_ids: list[int] | tuple[int, ...]) -> None:
    """Give back claims on trials the driver will not run (it is stopping)."""
    if trial_ids:
        conn.execute(
            sa.update(Trial)
            .where(Trial.id.in_(list(trial_ids)), Trial.claimed_by == owner)
            .values(claimed_by=None, claim_expires_at=None)
        )


def taken_from(conn: Connection, owner: str, trial_ids: Collection[int], *, heartbeat: bool = False) -> set[int]:
    """Of ``trial_ids``, those this driver no longer holds (another driver's claim now, or
    none: another driver took it over and has already ended it), with every one of them
    locked until the caller's transaction ends (PostgreSQL's row locks; SQLite's write lock,
    taken here: call it first in the transaction), so
    no claim can move while the caller writes for the rest. A driver cut off from the database
    longer than the TTL finds here the trials taken over meanwhile, and writes nothing more
    for them: the new attempt's trace stays its own.

    With ``heartbeat`` the trials still held get their heartbeat in the same statement
    (:func:`hold`)."""
    ids = sorted(trial_ids)
    if not ids:
        return set()
    if heartbeat:
        return hold(conn, owner, ids).gone
    # SQLite: the write lock before the read, so the writes that follow need no upgrade.
    dialect.for_connection(conn).lock_for_claim(conn)
    rows = conn.execute(sa.select(Trial.id, Trial.claimed_by).where(Trial.id.in_(ids)).with_for_update()).all()
    return {r.id for r in rows if r.claimed_by != owner}


def still_held(conn: Connection, owner: str, trial_ids: Collection[int]) -> list[int]:
    """Of ``trial_ids``, those ``owner`` still holds, in the order given (a plain read: what a
    chain of trials asks before each of its attempts, runner/trainable.py). A trial whose end
    was stored has been let go, so a chain retried after its worker died skips the members
    that ended before it died."""
    ids = list(trial_ids)
    if not ids:
        return []
    mine = set(conn.execute(sa.select(Trial.id).where(Trial.id.in_(ids), Trial.claimed_by == owner)).scalars())
    return [t for t in ids if t in mine]


@dataclass(frozen=True)
class Held:
    """What :func:`hold` found: the trials this driver no longer holds, and what the
    attempts that begin on the others read (``attempts.begin_attempt(read=...)``)."""

    gone: set[int]
    reads: dict[int, attempts.AttemptRead]


def hold(
    conn: Connection, owner: str, trial_ids: Collection[int], starts: Mapping[int, attempts.RowStart] | None = None
) -> Held:
    """:func:`taken_from` with the heartbeat of the trials still held (``lease.heartbeat(...,
    reported=True)``) and their starts (``starts``: a trial's running mark, placement and
    its new attempt's read) in the one statement that checks and locks them, an ``UPDATE
    ... WHERE claimed_by = owner RETURNING``: the writer's flush pays one statement for its
    ownership check, its heartbeats and the starts on the trials' rows (issue 34). A row the
    UPDATE skips is one this driver does not hold, so it is not locked, started or written.
    The UPDATE is the transaction's first statement, so SQLite takes its write lock with it
    (no read to upgrade); PostgreSQL locks the rows it updates, and re-checks the owner of a
    row another transaction held once that one ends."""
    ids = sorted(set(trial_ids) | set(starts or ()))
    if not ids:
        return Held(set(), {})
    starts = starts or {}
    reads = attempts.start_reads(starts)
    beaten = lease.heartbeat(
        conn, ids, reported=True, held_by=owner, also={t: s.values for t, s in starts.items()}, returning=reads
    )
    begins = {t for t, s in starts.items() if s.begins}
    return Held(
        set(ids) - beaten.keys(),
        {t: attempts.AttemptRead.of(row) for t, row in beaten.items() if t in begins},
    )


def held_elsewhere(conn: Connection, sweep: int, owner: str) -> int:
    """Unfinished trials of the sweep another driver holds a live claim on (a driver with
    nothing left to claim waits for them: they come free if that driver dies)."""
    d = dialect.for_connection(conn)
    return conn.execute(
        sa.select(sa.func.count(Trial.id)).where(
            Trial.sweep_id == sweep, Trial.status.in_(CLAIMABLE), _live_claim(d), Trial.claimed_by != owner
        )
    ).scalar_one()


# ---- reading --------------------------------------------------------------------------------------


@dataclass
class DriverRow:
    id: int
    owner: str
    host: str | None
    pid: int | None
    command: str | None
    started_at: Any
    heartbeat_at: Any
    ended_at: Any
    end_reason: str | None
    live: bool
    claimed: int
    running: int
    slurm_job: str | None = None

    def summary(self) -> str:
        return f"driver {self.owner[:8]} (pid {self.pid} on {self.host}, last heartbeat {self.heartbeat_at})"


def drivers(conn: Connection, sweep: int, *, ttl: float, live_only: bool = False) -> list[DriverRow]:
    """The sweep's drivers, oldest first, each with the trials it holds (``claimed``) and of
    them those ``running``; ``live``: not ended and heartbeating within ``ttl``."""
    d = dialect.for_connection(conn)
    held = (
        sa.select(sa.func.count(Trial.id))
        .where(Trial.claimed_by == Driver.owner, _live_claim(d))
        .correlate(Driver)
        .scalar_subquery()
    )
    running = (
        sa.select(sa.func.count(Trial.id))
        .where(Trial.claimed_by == Driver.owner, _live_claim(d), Trial.status == Status.running.value)
        .correlate(Driver)
        .scalar_subquery()
    )
    live = _live_driver(d, ttl)
    stmt = sa.select(
        Driver.id,
        Driver.owner,
        Driver.host,
        Driver.pid,
        Driver.command,
        Driver.started_at,
        Driver.heartbeat_at,
        Driver.ended_at,
        Driver.end_reason,
        Driver.slurm_job,
        sa.case((live, 1), else_=0).label("live"),
        held.label("claimed"),
        running.label("running"),
    ).where(Driver.sweep_id == sweep)
    if live_only:
        stmt = stmt.where(live)
    return [
        DriverRow(**{**r._mapping, "live": bool(r.live), "claimed": int(r.claimed), "running": int(r.running)})
        for r in conn.execute(stmt.order_by(Driver.id))
    ]


def request_cancel(conn: Connection, sweep: int, *, ttl: float) -> int:
    """Flag every live driver of the sweep to stop; returns how many."""
    d = dialect.for_connection(conn)
    res = conn.execute(
        sa.update(Driver)
        .where(Driver.sweep_id == sweep, _live_driver(d, ttl))
        .values(cancel_requested_at=d.now_plus(0))
    )
    return res.rowcount or 0
