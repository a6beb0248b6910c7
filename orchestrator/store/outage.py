"""Riding out a database outage: a write retried with backoff until it lands or a time
budget runs out. The caller keeps what it meant to write until then (the writer's
pending rows), so a PostgreSQL restart loses nothing."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from orchestrator.errors import UserError
from orchestrator.store.dialect import describe

T = TypeVar("T")


class DatabaseUnavailable(UserError):
    """The database stayed unreachable past the outage budget; the sweep stopped."""

    exit_code = 75  # EX_TEMPFAIL: try again later (`orchestrator resume`)


def outage_budget_s() -> float:
    """How long a driver keeps retrying a lost database ($ORCH_DB_OUTAGE_S, default 300)."""
    try:
        return max(0.0, float(os.environ.get("ORCH_DB_OUTAGE_S", "300")))
    except ValueError:
        return 300.0


def is_transient(exc: BaseException) -> bool:
    """A lost or refused connection (or a locked SQLite file): worth trying again."""
    if isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
        return True
    return isinstance(exc, sa.exc.DBAPIError) and bool(exc.connection_invalidated)


def write_with_retry(
    engine: Engine,
    fn: Callable[[Connection], T],
    *,
    budget_s: float | None = None,
    on_wait: Callable[[BaseException, float], None] | None = None,
) -> T:
    """Run ``fn`` in a transaction; on a transient error back off (0.5 s doubling to 10 s)
    and try again until ``budget_s`` has passed, then raise DatabaseUnavailable."""
    budget = outage_budget_s() if budget_s is None else budget_s
    start = time.monotonic()
    delay = 0.5
    while True:
        try:
            with engine.begin() as conn:
                return fn(conn)
        except Exception as exc:
            if not is_transient(exc):
                raise
            waited = time.monotonic() - start
            if waited >= budget:
                first = str(getattr(exc, "orig", exc)).strip().splitlines()
                raise DatabaseUnavailable(
                    f"database {describe(str(engine.url))} unreachable for {waited:.0f} s "
                    f"({first[0] if first else type(exc).__name__}); the sweep stopped, "
                    "`orchestrator resume` continues it"
                ) from None
            if on_wait is not None:
                on_wait(exc, waited)
            time.sleep(min(delay, max(0.0, budget - waited)))
            delay = min(delay * 2, 10.0)
