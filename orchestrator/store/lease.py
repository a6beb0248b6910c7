"""The sweep's lease: held for the exclusive steps only (a design written or amended by
``submit``/``resume``, a ``delete``), and trial heartbeats.

Many drivers run a sweep at once through their claims (store/claims.py, which also holds the
cancel flag and the one way running trials become interrupted). The lease is for what needs
the sweep alone. A driver claims it with one conditional UPDATE
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from orchestrator.status import Status
from orchestrator.store import dialect
from orchestrator.store.models import SweepRow, Trial


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
        )
    )
    return (res.rowcount or 0) == 1


def renew(conn: Connection, sweep: int, owner: str, *, ttl: float) -> bool:
    """Extend the lease; whether ``owner`` still holds it."""
    d = dialect.for_connection(conn)
    res = conn.execute(
        sa.update(SweepRow)
        .where(SweepRow.id == sweep, SweepRow.lease_owner == owner)
        .values(lease_expires_at=d.now_plus(ttl), lease_renewed_at=d.now_plus(0))
    )
    return (res.rowcount or 0) == 1


def release(conn: Connection, sweep: int, owner: str) -> None:
    conn.execute(
        sa.update(SweepRow)
        .where(SweepRow.id == sweep, SweepRow.lease_owner == owner)
        .values(lease_owner=None, lease_host=None, lease_pid=None, lease_expires_at=None)
    )


def heartbeat(
    conn: Connection,
    trial_ids: Iterable[int],
    *,
    reported: bool = False,
    held_by: str | None = None,
    also: Mapping[int, Mapping[str, Any]] | None = None,
    returning: Sequence[Any] = (),
) -> dict[int, tuple[Any, ...]]:
    """The one heartbeat of running trials, written by their driver's renewal and, for the
    trials that ``reported`` since the last flush, by its writer (their ``updated_at`` too):
    what the stale rule compares with the database clock. With ``held_by`` only the trials
    that driver holds are beaten (``claims.taken_from``'s check). ``also``: more values of
    some trials' rows, set by the same statement (a start's running mark and placement,
    ``claims.hold``); ``returning``: columns read back for each trial beaten (with
    ``held_by``). Returns the trials beaten, each with its ``returning`` values."""
    ids = list(trial_ids)
    if not ids:
        return {}
    now = dialect.for_connection(conn).now_plus(0)
    values: dict[str, Any] = {"heartbeat_at": now, "updated_at": now} if reported else {"heartbeat_at": now}
    for column in {c for v in (also or {}).values() for c in v} - values.keys():
        # One CASE a column: the trials that change it, every other row keeping its own.
        table_column = Trial.__table__.c[column]
        changes = [(Trial.id == tid, v[column]) for tid, v in (also or {}).items() if column in v]
        values[column] = sa.case(*changes, else_=table_column)
    if held_by is None:
        conn.execute(sa.update(Trial).where(Trial.id.in_(ids)).values(**values))
        return {t: () for t in ids}
    beaten = conn.execute(
        sa.update(Trial)
        .where(Trial.id.in_(ids), Trial.claimed_by == held_by)
        .values(**values)
        .returning(Trial.id, *returning)
    )
    return {r[0]: tuple(r[1:]) for r in beaten}


def stale_condition(conn: Connection, ttl: float | None = None) -> Any:
    """SQL: a running trial whose heartbeat (or, before its first one, its last update) is
    older than the lease TTL; its driver is gone."""
    age = dialect.for_connection(conn).now_plus(-(ttl if ttl is not None else lease_ttl_s()))
    beat = sa.func.coalesce(Trial.heartbeat_at, Trial.updated_at, Trial.started_at)
    return sa.and_(Trial.status == Status.running.value, beat < age)
