"""The lease a driver holds on a sweep, trial heartbeats and cancel requests.

One driver runs a sweep at a time. It claims the sweep's lease with one conditional UPDATE
(atomic on SQLite, which serializes writers, and on PostgreSQL, where a concurrent UPDATE
of the same row waits and then re-checks the condition), renews it every ``ttl / 4``
seconds and releases it at exit. Every time is the database's clock, so drivers on
machines with skewed clocks agree on who holds what. A lease whose expiry has passed is
free; so is one held by a dead process on this same host (a SIGKILLed driver need not wait
out its TTL before ``resume``).
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from orchestrator.status import Status
from orchestrator.store import dialect
from orchestrator.store.models import Attempt, SweepRow, Trial


def lease_ttl_s() -> float:
    """Seconds a lease lives without renewal ($ORCH_LEASE_TTL_S, default 60); also the age
    past which a running trial's heartbeat counts as stale."""
    try:
        return max(2.0, float(os.environ.get("ORCH_LEASE_TTL_S", "60")))
    except ValueError:
        return 60.0


@dataclass
class Holder:
    owner: str
    host: str | None
    pid: int | None
    expires_at: Any
    renewed_at: Any
    expired: bool

    def summary(self) -> str:
        return (
            f"driver {self.owner[:8]} (pid {self.pid} on {self.host}, "
            f"last heartbeat {self.renewed_at} on the database clock)"
        )


def new_owner() -> str:
    return uuid.uuid4().hex


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder(conn: Connection, sweep: int) -> Holder | None:
    """Who holds the sweep's lease (None: nobody); ``expired`` when it is free to take."""
    now_ = dialect.for_connection(conn).now_plus(0)
    row = conn.execute(
        sa.select(
            SweepRow.lease_owner,
            SweepRow.lease_host,
            SweepRow.lease_pid,
            SweepRow.lease_expires_at,
            SweepRow.lease_renewed_at,
            (SweepRow.lease_expires_at < now_).label("expired"),
        ).where(SweepRow.id == sweep)
    ).first()
    if row is None or row.lease_owner is None:
        return None
    expired = bool(row.expired)
    if (
        not expired
        and row.lease_host == socket.gethostname()
        and row.lease_pid
        and row.lease_pid != os.getpid()
        and not pid_alive(row.lease_pid)
    ):
        expired = True  # its process is gone: nobody will renew it
    return Holder(row.lease_owner, row.lease_host, row.lease_pid, row.lease_expires_at, row.lease_renewed_at, expired)


def claim(
    conn: Connection, sweep: int, owner: str, *, ttl: float, force: bool = False, dead_owner: str | None = None
) -> bool:
    """Take the lease if it is free, expired, ``dead_owner``'s (a holder found dead), or
    ``force``; one conditional UPDATE, so of two drivers racing exactly one wins."""
    d = dialect.for_connection(conn)
    cond = sa.or_(
        SweepRow.lease_owner.is_(None), SweepRow.lease_owner == owner, SweepRow.lease_expires_at < d.now_plus(0)
    )
    if dead_owner is not None:
        cond = sa.or_(cond, SweepRow.lease_owner == dead_owner)
    where = [SweepRow.id == sweep] if force else [SweepRow.id == sweep, cond]
    res = conn.execute(
        sa.update(SweepRow)
        .where(*where)
        .values(
            lease_owner=owner,
            lease_host=socket.gethostname(),
            lease_pid=os.getpid(),
            lease_expires_at=d.now_plus(ttl),
            lease_renewed_at=d.now_plus(0),
            cancel_requested_at=None,
        )
    )
    return (res.rowcount or 0) == 1


def renew(
    conn: Connection, sweep: int, owner: str, *, ttl: float, running: list[int] | tuple[int, ...] = ()
) -> tuple[bool, bool]:
    """Extend the lease and heartbeat the trials the driver is running.
    Returns (still held, cancel requested)."""
    d = dialect.for_connection(conn)
    res = conn.execute(
        sa.update(SweepRow)
        .where(SweepRow.id == sweep, SweepRow.lease_owner == owner)
        .values(lease_expires_at=d.now_plus(ttl), lease_renewed_at=d.now_plus(0))
    )
    held = (res.rowcount or 0) == 1
    if held and running:
        heartbeat(conn, running)
    cancel = (
        conn.execute(sa.select(SweepRow.cancel_requested_at).where(SweepRow.id == sweep)).scalar_one_or_none()
        is not None
    )
    return held, cancel


def release(conn: Connection, sweep: int, owner: str) -> None:
    conn.execute(
        sa.update(SweepRow)
        .where(SweepRow.id == sweep, SweepRow.lease_owner == owner)
        .values(lease_owner=None, lease_host=None, lease_pid=None, lease_expires_at=None, cancel_requested_at=None)
    )


def heartbeat(conn: Connection, trial_ids: list[int] | tuple[int, ...] | set[int]) -> None:
    ids = list(trial_ids)
    if ids:
        conn.execute(
            sa.update(Trial).where(Trial.id.in_(ids)).values(heartbeat_at=dialect.for_connection(conn).now_plus(0))
        )


def request_cancel(conn: Connection, sweep: int) -> None:
    conn.execute(
        sa.update(SweepRow)
        .where(SweepRow.id == sweep)
        .values(cancel_requested_at=dialect.for_connection(conn).now_plus(0))
    )


def interrupt_running(conn: Connection, sweep: int) -> int:
    """Trials left ``running`` (by a driver stopping, or one found dead) become
    ``interrupted``; resume runs them again from their checkpoints. Returns how many."""
    # Their open attempts end interrupted too (store.attempts holds the other ways one ends;
    # not imported here: the analysis reads through this module and never a writer).
    running = sa.select(Trial.id).where(Trial.sweep_id == sweep, Trial.status == Status.running.value)
    conn.execute(
        sa.update(Attempt)
        .where(Attempt.trial_id.in_(running.scalar_subquery()), Attempt.outcome.is_(None))
        .values(ended_at=sa.func.now(), outcome=Status.interrupted.value)
    )
    res = conn.execute(
        sa.update(Trial)
        .where(Trial.sweep_id == sweep, Trial.status == Status.running.value)
        .values(status=Status.interrupted.value, updated_at=sa.func.now())
    )
    return res.rowcount or 0


def stale_condition(conn: Connection, ttl: float | None = None) -> Any:
    """SQL: a running trial whose heartbeat (or, before its first one, its last update) is
    older than the lease TTL; its driver is gone."""
    age = dialect.for_connection(conn).now_plus(-(ttl if ttl is not None else lease_ttl_s()))
    beat = sa.func.coalesce(Trial.heartbeat_at, Trial.updated_at, Trial.started_at)
    return sa.and_(Trial.status == Status.running.value, beat < age)
