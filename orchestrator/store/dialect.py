"""Every difference between the storage backends, in one place.

A backend is a :class:`Dialect`: how its URLs look, how an engine is made and tuned, how a
batch of eval rows is upserted on the hot path, and how one statement runs read-only.
Everything else in the store (models, migrations, repo functions) is plain SQLAlchemy and
backend-neutral. A new backend is a subclass here plus its entry in :data:`DIALECTS`.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from orchestrator.errors import UserError

Rows = tuple[list[str], list[tuple[Any, ...]]]

# Pragmas that only read (a pragma with an argument or `= value` sets something).
READ_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_list", "index_info",
                "index_xinfo", "foreign_key_list", "database_list", "compile_options",
                "user_version", "schema_version", "application_id", "page_count",
                "page_size", "journal_mode", "function_list", "pragma_list", "collation_list",
                "freelist_count", "encoding"}


def describe(url: str) -> str:
    """URL safe to print (password hidden)."""
    return sa.engine.make_url(url).render_as_string(hide_password=True)


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL (None for PostgreSQL or in-memory SQLite)."""
    u = sa.engine.make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


class Dialect:
    name: ClassVar[str]
    prefixes: ClassVar[tuple[str, ...]]

    def make_engine(self, url: str, *, create_dir: bool = True) -> Engine:
        raise NotImplementedError

    def missing(self, url: str) -> Path | None:
        """The file a URL names when it does not exist yet (file-based backends only)."""
        return None

    def upsert(self, conn: Connection, table: str, fields: Sequence[str], set_clause: str,
               batch: Sequence[tuple[Any, ...]]) -> None:
        """``INSERT ... ON CONFLICT DO UPDATE SET set_clause`` of ``batch`` into ``table``,
        inside the caller's transaction, at the driver's best speed."""
        raise NotImplementedError

    def readonly_query(self, url: str, body: str) -> Rows:
        raise NotImplementedError

    def now_plus(self, seconds: float) -> Any:
        """The database clock plus ``seconds`` (negative: minus), as a SQL expression whose
        values compare correctly with ``func.now()`` on this backend (leases, staleness)."""
        raise NotImplementedError


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    # NORMAL is durable across process crashes in WAL mode (only power loss can drop the
    # last transactions); FULL would fsync on every commit.
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                    sqlite3.SQLITE_RECURSIVE}


def _authorizer(action: int, arg1, arg2, dbname, source) -> int:
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and arg2 is None and (arg1 or "").lower() in READ_PRAGMAS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


class SQLite(Dialect):
    """WAL mode with a busy timeout, so readers never block the single writer."""

    name = "sqlite"
    prefixes = ("sqlite",)

    def make_engine(self, url: str, *, create_dir: bool = True) -> Engine:
        path = sqlite_path(url)
        if path is not None and create_dir:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"timeout": 30})
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine

    def now_plus(self, seconds: float) -> Any:
        # CURRENT_TIMESTAMP (what func.now() writes) and datetime('now', ...) are both UTC
        # text 'YYYY-MM-DD HH:MM:SS', so they order as strings.
        return sa.func.datetime("now", f"{float(seconds):+.3f} seconds")

    def missing(self, url: str) -> Path | None:
        path = sqlite_path(url)
        return path if path is not None and not path.exists() else None

    def upsert(self, conn, table, fields, set_clause, batch) -> None:
        # One prepared executemany straight on the driver.
        sql = (f"INSERT INTO {table} ({', '.join(fields)}) VALUES "
               f"({', '.join('?' for _ in fields)}) "
               f"ON CONFLICT (trial_id, step) DO UPDATE SET {set_clause}")
        cur = conn.connection.driver_connection.cursor()
        try:
            cur.executemany(sql, batch)
        finally:
            cur.close()

    def readonly_query(self, url: str, body: str) -> Rows:
        # mode=ro plus an authorizer that denies writes, ATTACH and assigning PRAGMAs.
        path = sqlite_path(url)
        if path is None or not path.exists():
            raise UserError(f"no database at {path} (run a sweep first, or pass --db)")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            conn.set_authorizer(_authorizer)
            try:
                cur = conn.execute(body)
                rows = cur.fetchall()
            except sqlite3.DatabaseError as exc:
                raise UserError(f"query failed: {exc}") from None
            cols = [d[0] for d in cur.description or ()]
            return cols, rows
        finally:
            conn.close()


class PostgreSQL(Dialect):
    name = "postgresql"
    prefixes = ("postgresql",)

    def make_engine(self, url: str, *, create_dir: bool = True) -> Engine:
        try:
            return sa.create_engine(url, pool_pre_ping=True)
        except Exception as exc:  # e.g. missing driver, malformed URL
            raise UserError(f"database URL {describe(url)!r}: {exc}") from exc

    def now_plus(self, seconds: float) -> Any:
        return sa.literal_column(f"(now() + interval '{float(seconds):.3f} seconds')",
                                 type_=sa.DateTime(timezone=True))

    def upsert(self, conn, table, fields, set_clause, batch) -> None:
        # COPY into a staging table and one INSERT ... ON CONFLICT (row-at-a-time upserts
        # manage a fraction of that).
        cols = ", ".join(fields)
        stage = f"_{table}_in"
        with conn.connection.driver_connection.cursor() as cur:
            cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {stage} "
                        f"(LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
            with cur.copy(f"COPY {stage} ({cols}) FROM STDIN") as copy:
                for row in batch:
                    copy.write_row(row)
            cur.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {stage} "
                        f"ON CONFLICT (trial_id, step) DO UPDATE SET {set_clause}")
            cur.execute(f"TRUNCATE {stage}")

    def readonly_query(self, url: str, body: str) -> Rows:
        # A READ ONLY transaction, and the extended query protocol refuses stacked statements.
        engine = self.make_engine(url)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                raw = conn.connection.driver_connection
                assert raw is not None  # a checked-out connection always has one
                try:
                    with raw.cursor() as cur:
                        cur.execute(body, prepare=True)  # extended protocol: one statement only
                        cols = [d.name for d in cur.description or ()]
                        rows = cur.fetchall() if cur.description else []
                except Exception as exc:
                    raw.rollback()
                    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    raise UserError(f"query failed: {msg}") from None
                conn.rollback()
                return cols, [tuple(r) for r in rows]
        except sa.exc.OperationalError as exc:
            raise UserError(f"cannot open database {describe(url)}: {exc.orig}") from None
        finally:
            engine.dispose()


DIALECTS: tuple[Dialect, ...] = (SQLite(), PostgreSQL())


def for_url(url: str) -> Dialect:
    """The backend of a resolved SQLAlchemy URL."""
    for d in DIALECTS:
        if url.startswith(d.prefixes):
            return d
    return DIALECTS[-1]  # unknown schemes are refused earlier, by resolve_url


def for_connection(conn: Connection) -> Dialect:
    for d in DIALECTS:
        if conn.dialect.name == d.name:
            return d
    raise UserError(f"unsupported database backend {conn.dialect.name!r}")
