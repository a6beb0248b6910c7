"""Riding out a database outage: a write retried with backoff until it lands or a time
budget runs out. The caller keeps what it meant to write until then (the writer's
pending rows), so a PostgreSQL restart loses nothing.

An outage is not a loss: a database that is gone for good (its SQLite file deleted or
replaced by another file, its tables dropped) is never retried and never written again,
so nothing lands in a stranger's database and a driver does not wait out the outage
budget for a file that will not come back (:class:`DatabaseGone`, :class:`StorePin`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from orchestrator.errors import UserError
from orchestrator.store.dialect import DIALECTS, describe, sqlite_path

T = TypeVar("T")


class DatabaseUnavailable(UserError):
    """The database stayed unreachable past the outage budget; the sweep stopped."""

    exit_code = 75  # EX_TEMPFAIL: try again later (`orchestrator resume`)


class DatabaseGone(UserError):
    """The sweep's database disappeared or was replaced under the running driver."""

    exit_code = 74  # EX_IOERR: not an outage; `resume` cannot continue in what is there now


def outage_budget_s() -> float:
    """How long a driver keeps retrying a lost database ($ORCH_DB_OUTAGE_S, default 300)."""
    try:
        return max(0.0, float(os.environ.get("ORCH_DB_OUTAGE_S", "300")))
    except ValueError:
        return 300.0


def is_gone(exc: BaseException) -> bool:
    """An error that says the sweep's tables (or the whole database) no longer exist, as its
    backend words it (``Dialect.is_gone``)."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return False
    orig = getattr(exc, "orig", exc)
    return any(d.is_gone(orig) for d in DIALECTS)


def is_transient(exc: BaseException) -> bool:
    """A lost or refused connection (or a locked SQLite file): worth trying again."""
    if is_gone(exc):
        return False
    if isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
        return True
    return isinstance(exc, sa.exc.DBAPIError) and bool(exc.connection_invalidated)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", exc)).strip().splitlines()
    return text[0] if text else type(exc).__name__


def gone_error(engine: Engine, exc: BaseException) -> DatabaseGone:
    """The one line for a database whose tables vanished mid-run (``is_gone(exc)``)."""
    return DatabaseGone(
        f"database {describe(str(engine.url))} lost the sweep's tables while it ran ({_first_line(exc)}); "
        "the sweep stopped and wrote nothing more"
    )


class StorePin:
    """Which database a driver opened, so that a write can tell it is still that one.

    A SQLite file is pinned by its (device, inode) at open: deleting it leaves the driver's
    open connections writing to an unlinked inode (every row lost, exit 0), and replacing it
    with another file would send new connections to a database that is not the sweep's. A
    PostgreSQL database has no such handle; dropped tables show as errors (:func:`is_gone`)."""

    def __init__(self, engine: Engine):
        self.url = str(engine.url)
        self.path: Path | None = sqlite_path(self.url)
        self.ident = self._ident() if self.path is not None else None

    def _ident(self) -> tuple[int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def check(self) -> None:
        """Raise DatabaseGone if the pinned file is no longer at its path."""
        if self.path is None or self.ident is None:
            return
        now = self._ident()
        if now == self.ident:
            return
        what = "deleted" if now is None else "replaced by another file"
        raise DatabaseGone(
            f"database file {self.path} was {what} while the sweep ran; the sweep stopped and wrote "
            "nothing more (trial checkpoints are kept)"
        )


def write_with_retry(
    engine: Engine,
    fn: Callable[[Connection], T],
    *,
    budget_s: float | None = None,
    on_wait: Callable[[BaseException, float], None] | None = None,
    pin: StorePin | None = None,
) -> T:
    """Run ``fn`` in a transaction; on a transient error back off (0.5 s doubling to 10 s)
    and try again until ``budget_s`` has passed, then raise DatabaseUnavailable. With a
    ``pin``, a database that is gone (file deleted or replaced, tables dropped) raises
    DatabaseGone at once, before anything is written to whatever is there now."""
    return _with_retry(engine, engine.begin, fn, budget_s, on_wait, pin)


def read_with_retry(
    engine: Engine,
    fn: Callable[[Connection], T],
    *,
    budget_s: float | None = 0.0,
    pin: StorePin | None = None,
) -> T:
    """Run ``fn`` on one connection, classified and retried as :func:`write_with_retry`
    does (default ``budget_s`` 0: one try)."""
    return _with_retry(engine, engine.connect, fn, budget_s, None, pin)


def _with_retry(
    engine: Engine,
    open_conn: Callable[[], Any],
    fn: Callable[[Connection], T],
    budget_s: float | None,
    on_wait: Callable[[BaseException, float], None] | None,
    pin: StorePin | None,
) -> T:
    budget = outage_budget_s() if budget_s is None else budget_s
    start = time.monotonic()
    delay = 0.5
    while True:
        if pin is not None:
            pin.check()
        try:
            with open_conn() as conn:
                return fn(conn)
        except Exception as exc:
            if is_gone(exc):
                if pin is not None:
                    pin.check()  # a replaced file is named as such
                raise gone_error(engine, exc) from None
            if not is_transient(exc):
                raise
            waited = time.monotonic() - start
            if waited >= budget:
                raise DatabaseUnavailable(
                    f"database {describe(str(engine.url))} unreachable for {waited:.0f} s "
                    f"({_first_line(exc)}); the sweep stopped, "
                    "`orchestrator resume` continues it"
                ) from None
            if on_wait is not None:
                on_wait(exc, waited)
            time.sleep(min(delay, max(0.0, budget - waited)))
            delay = min(delay * 2, 10.0)
