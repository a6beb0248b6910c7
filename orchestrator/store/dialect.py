"""Every difference between the storage backends, in one place.

A backend is a :class:`Dialect`: how its URLs look, how an engine is made and tuned, how a
batch of eval rows is upserted on the hot path, and how one statement runs read-only.
Everything else in the store (models, migrations, repo functions) is plain SQLAlchemy and
backend-neutral. A new backend is a subclass here plus its entry in :data:`DIALECTS`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from orchestrator.errors import UserError

Rows = tuple[list[str], list[tuple[Any, ...]]]

# Pragmas that only read (a pragma with an argument or `= value` sets something).
READ_PRAGMAS = {
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "database_list",
    "compile_options",
    "user_version",
    "schema_version",
    "application_id",
    "page_count",
    "page_size",
    "journal_mode",
    "function_list",
    "pragma_list",
    "collation_list",
    "freelist_count",
    "encoding",
}


DEFAULT_QUERY_TIMEOUT_S = 60.0


def describe(url: str) -> str:
    """URL safe to print (password hidden; a SQLite file as its plain path). Idempotent: a
    plain path (what this returns for SQLite) is returned as it is."""
    if "://" not in url:
        return url
    path = sqlite_path(url)
    if path is not None:
        return str(path)
    return sa.engine.make_url(url).render_as_string(hide_password=True)


def sqlite_url(path: str | Path) -> str:
    """The SQLAlchemy URL of a SQLite file. The path is percent-encoded, so ``#``, ``?``,
    ``%``, spaces and non-ASCII survive the URL parser (which decodes it once, in
    :func:`sqlite_path`); every command reaches the file through this and
    :func:`sqlite_connect`."""
    return "sqlite:///" + quote(str(Path(path).expanduser().resolve()), safe="/")


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL (None for PostgreSQL or in-memory SQLite)."""
    u = sa.engine.make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


def sqlite_connect(path: Path, *, readonly: bool = False, timeout: float = 30.0) -> sqlite3.Connection:
    """The one way a SQLite file is opened: a ``file:`` URI with the path percent-encoded
    (a bare ``#`` or ``?`` would end the path), ``mode=ro`` for readers (the file is never
    created or written) and ``rwc`` for the store."""
    uri = f"file:{quote(str(path), safe='/')}?mode={'ro' if readonly else 'rwc'}"
    return sqlite3.connect(uri, uri=True, timeout=timeout, check_same_thread=False)


class Dialect:
    name: ClassVar[str]
    prefixes: ClassVar[tuple[str, ...]]

    def make_engine(self, url: str, *, create_dir: bool = True) -> Engine:
        raise NotImplementedError

    def missing(self, url: str) -> Path | None:
        """The file a URL names when it does not exist yet (file-based backends only)."""
        return None

    def upsert(
        self, conn: Connection, table: str, fields: Sequence[str], set_clause: str, batch: Sequence[tuple[Any, ...]]
    ) -> None:
        """``INSERT ... ON CONFLICT DO UPDATE SET set_clause`` of ``batch`` into ``table``,
        inside the caller's transaction, at the driver's best speed."""
        raise NotImplementedError

    def readonly_query(self, url: str, body: str, *, timeout_s: float = DEFAULT_QUERY_TIMEOUT_S) -> Rows:
        """Run ``body`` exactly as given, read-only by the connection itself, cancelled
        after ``timeout_s`` seconds."""
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


_TABLE_ARG_PRAGMAS = {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


def readonly_authorizer(action: int, arg1, arg2, dbname, source) -> int:
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA:
        name = (arg1 or "").lower()
        # An argument sets a value, except for the pragmas whose argument names a table.
        if name in READ_PRAGMAS and (arg2 is None or name in _TABLE_ARG_PRAGMAS):
            return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


class SQLite(Dialect):
    """WAL mode with a busy timeout, so readers never block the single writer."""

    name = "sqlite"
    prefixes = ("sqlite",)

    def make_engine(self, url: str, *, create_dir: bool = True) -> Engine:
        path = sqlite_path(url)
        if path is None:  # in-memory
            engine = sa.create_engine(url, connect_args={"timeout": 30})
        else:
            if create_dir:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise UserError(f"cannot create the folder of database {path}: {exc.strerror or exc}") from None
            engine = sa.create_engine(url, creator=lambda: sqlite_connect(path))
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
        sql = (
            f"INSERT INTO {table} ({', '.join(fields)}) VALUES "
            f"({', '.join('?' for _ in fields)}) "
            f"ON CONFLICT (trial_id, step) DO UPDATE SET {set_clause}"
        )
        cur = conn.connection.driver_connection.cursor()
        try:
            cur.executemany(sql, batch)
        finally:
            cur.close()

    def readonly_query(self, url: str, body: str, *, timeout_s: float = DEFAULT_QUERY_TIMEOUT_S) -> Rows:
        # mode=ro plus an authorizer that denies writes, ATTACH and assigning PRAGMAs; a
        # progress handler interrupts a query past its deadline.
        path = sqlite_path(url)
        if path is None or not path.is_file():
            raise UserError(f"no database at {path} (run a sweep first, or pass --db)")
        try:
            conn = sqlite_connect(path, readonly=True)
        except sqlite3.Error as exc:
            raise UserError(f"cannot open database {path}: {exc}") from None
        deadline = time.monotonic() + timeout_s
        timed_out = False

        def _progress() -> int:
            nonlocal timed_out
            timed_out = time.monotonic() > deadline
            return 1 if timed_out else 0

        try:
            conn.set_authorizer(readonly_authorizer)
            conn.set_progress_handler(_progress, 10_000)
            try:
                cur = conn.execute(body)
                rows = cur.fetchall()
            except sqlite3.Warning as exc:  # e.g. "You can only execute one statement"
                raise UserError(f"query refused: {exc}") from None
            except sqlite3.DatabaseError as exc:
                if timed_out:
                    raise UserError(
                        f"query cancelled after the {timeout_s:g} s timeout (--timeout to change)"
                    ) from None
                if "not authorized" in str(exc) or "readonly" in str(exc):
                    raise UserError(f"refused: `orchestrator sql` is read-only ({exc})") from None
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
        return sa.literal_column(f"(now() + interval '{float(seconds):.3f} seconds')", type_=sa.DateTime(timezone=True))

    def upsert(self, conn, table, fields, set_clause, batch) -> None:
        # COPY into a staging table and one INSERT ... ON CONFLICT (row-at-a-time upserts
        # manage a fraction of that).
        cols = ", ".join(fields)
        stage = f"_{table}_in"
        with conn.connection.driver_connection.cursor() as cur:
            cur.execute(
                f"CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
            )
            with cur.copy(f"COPY {stage} ({cols}) FROM STDIN") as copy:
                for row in batch:
                    copy.write_row(row)
            cur.execute(
                f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {stage} "
                f"ON CONFLICT (trial_id, step) DO UPDATE SET {set_clause}"
            )
            cur.execute(f"TRUNCATE {stage}")

    def readonly_query(self, url: str, body: str, *, timeout_s: float = DEFAULT_QUERY_TIMEOUT_S) -> Rows:
        # A READ ONLY transaction with a statement_timeout, and the extended query protocol
        # refuses stacked statements.
        engine = self.make_engine(url)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                conn.exec_driver_sql(f"SET LOCAL statement_timeout = {int(timeout_s * 1000)}")
                # Take the snapshot now: after it, `SET TRANSACTION READ WRITE` is an error.
                conn.exec_driver_sql("SELECT 1")
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
                    if getattr(exc, "sqlstate", None) == "57014":  # query_canceled
                        raise UserError(
                            f"query cancelled after the {timeout_s:g} s timeout (--timeout to change)"
                        ) from None
                    if getattr(exc, "sqlstate", None) in ("25006", "42501"):
                        raise UserError(f"refused: `orchestrator sql` is read-only ({msg})") from None
                    raise UserError(f"query failed: {msg}") from None
                # COMMIT/ROLLBACK as the statement would end the read-only transaction.
                import psycopg

                if raw.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
                    raise UserError(
                        "refused: transaction control is not allowed in `orchestrator sql` (it is read-only)"
                    )
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
