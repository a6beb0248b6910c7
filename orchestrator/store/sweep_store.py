"""The store as the runner, the checkpoint loader and the lifecycle commands hold it: one
database, opened once, reached only through :meth:`SweepStore.read` and
:meth:`SweepStore.write` (the functions they pass get a SQLAlchemy ``Connection`` and call
the store's own SQL in ``store.repo``, ``store.claims``, ``store.attempts``, ...).

The runner imports neither SQLAlchemy nor an ``Engine``: an import contract in
``pyproject.toml`` forbids the first, and ``tests/test_layers.py`` plants a violation to show
that it bites.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from orchestrator.store.engine import make_engine, open_store_engine
from orchestrator.store.outage import StorePin, read_with_retry, write_with_retry

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

T = TypeVar("T")


class SweepStore:
    """One database, as a driver uses it.

    The contract (what a caller may rely on; ``tests/test_sweep_store.py`` checks each):

    - **Atomic writes.** ``write(fn)`` runs ``fn(conn)`` in one transaction: it commits whole
      or not at all. Nothing a reader sees is half a write (a flush's eval rows, checkpoint
      and heartbeat land together).
    - **Retried writes.** A transient error (a lost or refused connection, a server restart,
      a locked SQLite file) rolls the transaction back and calls ``fn`` again from the start
      on a fresh connection, backing off 0.5 s doubling to 10 s, until ``budget_s`` has passed
      (default ``$ORCH_DB_OUTAGE_S``, 300 s); then :class:`~orchestrator.store.outage.DatabaseUnavailable`
      (exit 75, ``resume`` continues). So ``fn`` must be safe to run twice: every writer of
      the store is (upserts, conditional updates under the ownership check). Any other error
      is raised at once, after the rollback.
    - **A database that is gone is never written.** Its SQLite file deleted or replaced, or
      its tables dropped: :class:`~orchestrator.store.outage.DatabaseGone` (exit 74), before
      anything is written to whatever is there now, never retried. :meth:`check` asks the
      same of the file alone.
    - **Reads** (``read(fn)``) run ``fn`` on one connection and see committed data only
      (SQLite's WAL snapshot for the statement; PostgreSQL's READ COMMITTED: each statement
      sees what was committed before it began). Two statements in one ``read`` may see two
      commits apart; what must agree is read in one statement or in a ``write``. A read is
      retried like a write only when given a ``budget_s`` (the checkpoint loader rides an
      outage out; a status line does not wait).
    - **Threads.** One store may be used from several threads at once (a driver's renewal
      thread beside its writer): each call takes its own pooled connection and shares nothing
      with another call.
    - **Backends.** No backend difference lives here: each is a method of the Dialect
      (``store/dialect.py``), outage classification included (``Dialect.is_gone``).
    """

    def __init__(self, engine: Engine, url: str | None = None):
        self._engine = engine
        self.url = url if url is not None else engine.url.render_as_string(hide_password=False)
        self._pin = StorePin(engine)

    @classmethod
    def open(cls, db: str | None, spec_storage: str | None = None, *, auto_create: bool = True) -> SweepStore:
        """The database ``--db`` / the spec's ``storage:`` / ``$ORCH_DB`` name, gated on its
        schema version (``auto_create``: a missing SQLite file is made and migrated)."""
        engine, url = open_store_engine(db, spec_storage, auto_create=auto_create)
        return cls(engine, url)

    @classmethod
    def at(cls, url: str) -> SweepStore:
        """A store on a database known to exist at its version (a trial's worker opening the
        driver's database for its checkpoint): no schema gate, no folder made."""
        return cls(make_engine(url, create_dir=False), url)

    def read(self, fn: Callable[[Connection], T], *, budget_s: float | None = 0.0) -> T:
        """``fn(conn)`` on one connection (no transaction kept open past it); retried on a
        transient error only within ``budget_s`` (default 0: not retried; None: the outage
        budget)."""
        return read_with_retry(self._engine, fn, budget_s=budget_s, pin=self._pin)

    def write(self, fn: Callable[[Connection], T], *, budget_s: float | None = None) -> T:
        """``fn(conn)`` in one transaction, retried through an outage of up to ``budget_s``
        (default ``$ORCH_DB_OUTAGE_S``); see the class's contract."""
        return write_with_retry(self._engine, fn, budget_s=budget_s, pin=self._pin)

    def check(self) -> None:
        """Raise DatabaseGone if the SQLite file opened is no longer at its path."""
        self._pin.check()

    def dispose(self) -> None:
        """Close the pooled connections (the store can be used again: it reconnects)."""
        self._engine.dispose()
