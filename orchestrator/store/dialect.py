"""Every difference between the storage backends, in one place.

A backend is a :class:`Dialect`: how its URLs look, how an engine is made and tuned, how a
batch of eval rows is upserted on the hot path, and how one statement runs read-only.
Everything else in the store (models, migrations, repo functions) is plain SQLAlchemy and
backend-neutral. A new backend is a subclass here plus its entry in :data:`DIALECTS`.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from orchestrator.errors import UserError
from orchestrator.store import sql_screen
from orchestrator.store import deadline

Rows = tuple[list[str], list[tuple[Any, ...]]]


@dataclass(frozen=True)
class Limits:
    """How much a read on a user's behalf may bring back. ``deadline`` (``time.monotonic``)
    bounds fetching and, for the caller, formatting; rows past ``max_rows`` or
    ``max_bytes`` (values' sizes added up) are left unfetched and ``Fetched.cut`` says so."""

    max_rows: int = 100_000
    max_bytes: int = 64 * 2**20
    deadline: float = math.inf


@dataclass
class Fetched:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    cut: str | None = None  # why rows were left out ("max_rows" / "max_bytes"), None if none
    deadline: float = math.inf  # when the caller's --timeout runs out (formatting included)


def value_size(v: Any) -> int:
    """Bytes a value costs to show: its length for text and binary, a few for the rest."""
    if isinstance(v, (str, bytes, bytearray, memoryview)):
        return len(v)
    return 8 if isinstance(v, (int, float, bool)) or v is None else len(str(v))


def collect(rows: Iterator[Sequence[Any]], limits: Limits) -> tuple[list[tuple[Any, ...]], str | None]:
    """Rows from ``rows`` until a limit is reached (the iterator is left unexhausted)."""
    out: list[tuple[Any, ...]] = []
    total = 0
    for r in rows:
        if len(out) >= limits.max_rows:
            return out, "max_rows"
        total += sum(value_size(v) for v in r)
        if total > limits.max_bytes:
            return out, "max_bytes"
        out.append(tuple(r))
        if len(out) % 1024 == 0 and time.monotonic() > limits.deadline:
            raise UserError("query cancelled: fetching its rows ran past the --timeout (--timeout to change)")
    return out, None


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
    "read_uncommitted",  # SQLAlchemy reads it on connect
}

# Predefined roles whose members act on the server rather than read rows.
PG_ADMIN_ROLES = (
    "pg_execute_server_program",
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_signal_backend",
    "pg_checkpoint",
    "pg_write_all_data",
    "pg_create_subscription",
    "pg_signal_autovacuum_worker",
    "pg_maintain",
    "pg_use_reserved_connections",
)
# `db create-reader` marks the roles it makes with this comment; reads on a privileged URL
# switch to such a role.
READER_COMMENT = "orchestrator read-only role (db create-reader)"


DEFAULT_QUERY_TIMEOUT_S = 60.0
READER_POOL = 5  # connections a reader engine keeps (as many again on overflow)


def _past_deadline() -> int:
    """SQLite progress handler of the reader engines: non-zero interrupts the statement."""
    return 1 if deadline.passed() else 0


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


BUSY_TIMEOUT_S = 30.0  # how long a store connection waits for another's lock


def sqlite_uri(path: Path, *, readonly: bool) -> str:
    """The ``file:`` URI every SQLite connection opens: the path percent-encoded (a bare
    ``#`` or ``?`` would end the path), ``mode=ro`` for readers (the file is never created or
    written) and ``rwc`` for the store."""
    return f"file:{quote(str(path), safe='/')}?mode={'ro' if readonly else 'rwc'}"


def sqlite_connect(path: Path, *, readonly: bool = False, timeout: float = BUSY_TIMEOUT_S) -> sqlite3.Connection:
    """The one way the sqlite3 module opens a SQLite file (:func:`sqlite_uri`)."""
    return sqlite3.connect(sqlite_uri(path, readonly=readonly), uri=True, timeout=timeout, check_same_thread=False)


def set_length_limit(conn: sqlite3.Connection, n: int) -> None:
    """Make SQLite refuse to build a string or blob longer than ``n`` bytes (Python 3.11+;
    on 3.10 the output caps still apply, after the value is built)."""
    setlimit = getattr(conn, "setlimit", None)
    if setlimit is not None:
        setlimit(getattr(sqlite3, "SQLITE_LIMIT_LENGTH", 0), n)


class RawStatements:
    """How many statements the raw-cursor fast paths (:meth:`Dialect.upsert`) have sent.
    SQLAlchemy's cursor events never see them, so ``bench overhead`` adds this count to the
    statements it counts through the events (issue 34: statements a trial, all of them)."""

    sent = 0


raw_statements = RawStatements()


class Dialect:
    name: ClassVar[str]
    prefixes: ClassVar[tuple[str, ...]]  # what a resolved URL of this backend starts with
    schemes: ClassVar[tuple[str, ...]]  # the URL schemes a user may write (before any +driver)
    # Whether `db create-reader` can make a read-only login role (a file has no roles).
    reader_roles: ClassVar[bool] = False

    def route(self, url: str) -> str | None:
        """The URL to connect with when ``url`` (a URL a user gave) is this backend's, else None."""
        return url if url.startswith(self.prefixes) else None

    def storage_problem(self, value: str) -> str | None:
        """Why ``value`` cannot hold results on this backend (see :func:`storage_problem`)."""
        return None

    def time_param(self, t: dt.datetime) -> Any:
        """``t`` as a bound value that compares correctly with the stored timestamps."""
        return t

    def lock_for_migration(self, conn: Connection) -> None:
        """Make the migration transaction just begun on ``conn`` hold the write lock from
        its first statement (see ``engine._migration_transaction``)."""

    def lock_for_claim(self, conn: Connection) -> None:
        """Make the claim transaction just begun on ``conn`` exclusive of every other
        claimer's before it reads which trials are free (``store.claims.claim_batch``)."""

    def is_gone(self, orig: BaseException) -> bool:
        """Whether the driver-level error ``orig`` (``DBAPIError.orig``, or the error itself)
        says the sweep's tables or its whole database no longer exist: not an outage to ride
        out but a database never to write again (store/outage.py)."""
        return False

    def skip_locked(self, stmt: sa.Select) -> sa.Select:
        """``stmt`` (a SELECT of trials to claim) locking the rows it returns and passing
        over rows another claim transaction holds, so concurrent claimers get disjoint
        batches without waiting for each other."""
        return stmt

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

    def replace(
        self,
        conn: Connection,
        table: Any,
        rows: Sequence[dict[str, Any]],
        key: Sequence[str],
        *,
        now: Sequence[str] = (),
    ) -> None:
        """Insert ``rows`` into ``table`` in one statement, each replacing the row with the
        same ``key`` (its other columns, and the ``now`` columns set to their defaults)."""
        if not rows:
            return
        stmt = self._insert(table)
        changed = [c for c in rows[0] if c not in key] + list(now)
        conn.execute(
            stmt.on_conflict_do_update(index_elements=list(key), set_={c: stmt.excluded[c] for c in changed}),
            list(rows),
        )

    def _insert(self, table: Any) -> Any:
        """This backend's INSERT construct with ``on_conflict_do_update``."""
        raise NotImplementedError

    def screen(self, sql: str) -> None:
        """UserError (one line) unless ``sql`` is one statement this backend only reads with
        (``store/sql_screen.py``); the connection's read-only-ness stays the real guard."""
        raise NotImplementedError

    def reader_engine(self, url: str, *, pool_size: int = READER_POOL) -> Engine:
        """An engine that reads on a user's behalf with no more than a reader's rights, and
        cannot write, whatever the URL grants (UserError when that cannot be had). One
        connection per thread from a pool of ``pool_size`` (as many again on overflow);
        reads made inside :func:`orchestrator.store.deadline.within` are cancelled when its
        deadline passes."""
        raise NotImplementedError

    def fetch_arrays(self, url: str, sql: str, dtypes: Mapping[str, Any]) -> dict[str, Any] | None:
        """The rows of ``sql`` (our own SELECT, its columns labelled with ``dtypes``' names, in
        that order) as one numpy array a column of those dtypes, read as columns by the
        backend's Arrow driver with a reader's rights (a NULL in a float column is NaN); None
        where this backend has no such driver here, and the caller reads tuples. No deadline
        reaches the read: callers run it where a kill ends it (``ui.offload``'s children)."""
        return None

    def readonly_query(self, url: str, body: str, *, timeout_s: float, limits: Limits) -> Fetched:
        """Run ``body`` exactly as given, read-only by the connection itself and with a
        reader's rights, cancelled after ``timeout_s`` seconds; rows past ``limits`` are not
        fetched."""
        raise NotImplementedError

    def now_plus(self, seconds: float) -> Any:
        """The database clock plus ``seconds`` (negative: minus), as a SQL expression whose
        values compare correctly with ``func.now()`` on this backend (leases, staleness)."""
        raise NotImplementedError

    def database_bytes(self, conn: Any) -> int:
        """What the connection's database takes on disk: tables, indexes and their overflow
        (PostgreSQL: the tables of the current schema; SQLite: the file's pages)."""
        raise NotImplementedError

    # What :meth:`bulk_load` is, in words (``bench store`` prints it).
    bulk_load_name: ClassVar[str] = ""

    def clone_table(self, conn: Connection, source: str, target: str, *, foreign_keys: bool) -> None:
        """Make ``target`` with ``source``'s columns and primary key (and its foreign keys
        with ``foreign_keys``): the scratch table ``bench store`` loads its ceiling into."""
        raise NotImplementedError

    def bulk_load(self, conn: Connection, table: str, fields: Sequence[str], batch: Sequence[tuple[Any, ...]]) -> None:
        """The backend's own fastest load of ``batch`` into ``table`` (a plain insert, no
        conflict handling), inside the caller's transaction: the ceiling the writer's
        upsert is measured against."""
        raise NotImplementedError

    # Whether :meth:`vacuum` gives freed pages back to the file system (``db prune --vacuum``).
    vacuums: ClassVar[bool] = False

    def vacuum(self, engine: Engine) -> None:
        """Rewrite the database without its free pages (a file keeps the pages of deleted rows
        for reuse). Only where :attr:`vacuums`; PostgreSQL's autovacuum makes them reusable."""
        raise NotImplementedError


def _enter_wal(cur: sqlite3.Cursor, timeout_s: float = BUSY_TIMEOUT_S) -> None:
    """Put the file in WAL mode, waiting for other connections as the busy timeout would.

    Converting a new file takes its exclusive lock from a shared one. Two connections doing
    so at once (drivers opening one fresh database together) deadlock, and SQLite answers
    one of them "database is locked" at once, without calling the busy handler: so the wait
    is here. WAL is stored in the file, so only the first connections ever race."""
    deadline = time.monotonic() + timeout_s
    pause = 0.002
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    _enter_wal(cur)
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
    schemes = ("sqlite",)

    def storage_problem(self, value: str) -> str | None:
        memory = "is an in-memory SQLite database, gone when the run ends: give a file path or sqlite:///PATH"
        if ":memory:" in value.lower():
            return memory
        if "://" in value:
            try:
                u = sa.engine.make_url(value)
            except sa.exc.ArgumentError:
                return None  # malformed: the engine says so when it opens it
            if not (u.database or "").strip() or u.query.get("mode") == "memory":
                return memory
        return None

    def time_param(self, t: dt.datetime) -> Any:
        # CURRENT_TIMESTAMP is stored as UTC text 'YYYY-MM-DD HH:MM:SS': compare text to text.
        return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

    def lock_for_migration(self, conn: Connection) -> None:
        # pysqlite opens transactions only before DML, so each CREATE TABLE would commit
        # on its own; BEGIN IMMEDIATE takes the write lock now.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    def lock_for_claim(self, conn: Connection) -> None:
        # SQLite has no row locks: the write lock, taken before the SELECT, serializes
        # claimers (a deferred transaction would read, then fail to upgrade to a writer).
        # pysqlite opens a transaction only before DML, so one already open holds it.
        raw = conn.connection.driver_connection
        if raw is not None and not raw.in_transaction:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

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

    def database_bytes(self, conn: Any) -> int:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
        return int(pages) * int(conn.exec_driver_sql("PRAGMA page_size").scalar_one())

    bulk_load_name = "executemany, one transaction"

    def clone_table(self, conn, source, target, *, foreign_keys) -> None:
        # The source's own DDL: its primary key, and its foreign keys (checked: the pragma is on).
        ddl = conn.exec_driver_sql(f"SELECT sql FROM sqlite_master WHERE type = 'table' AND name = '{source}'")
        text = ddl.scalar_one().replace(source, target, 1)
        if not foreign_keys:
            text = re.sub(r",\s*FOREIGN KEY\s*\([^)]*\)[^,)]*\([^)]*\)[^,)]*", "", text)
        conn.exec_driver_sql(text)

    def bulk_load(self, conn, table, fields, batch) -> None:
        cur = conn.connection.driver_connection.cursor()
        try:
            cur.executemany(
                f"INSERT INTO {table} ({', '.join(fields)}) VALUES ({', '.join('?' for _ in fields)})", batch
            )
        finally:
            cur.close()

    # The messages of a file that is no longer the sweep's database.
    _GONE = ("no such table", "file is not a database")

    def is_gone(self, orig: BaseException) -> bool:
        return isinstance(orig, sqlite3.Error) and any(m in str(orig).lower() for m in self._GONE)

    vacuums = True

    def vacuum(self, engine: Engine) -> None:
        # VACUUM cannot run inside a transaction: a connection of its own, autocommitted.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM")
            # In WAL mode the rewritten pages sit in the log until a checkpoint moves them.
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    def now_plus(self, seconds: float) -> Any:
        # CURRENT_TIMESTAMP (what func.now() writes) and datetime('now', ...) are both UTC
        # text 'YYYY-MM-DD HH:MM:SS', so they order as strings.
        return sa.func.datetime("now", f"{float(seconds):+.3f} seconds")

    def missing(self, url: str) -> Path | None:
        path = sqlite_path(url)
        return path if path is not None and not path.exists() else None

    def _insert(self, table: Any) -> Any:
        from sqlalchemy.dialects.sqlite import insert

        return insert(table)

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
        raw_statements.sent += 1

    def screen(self, sql: str) -> None:
        sql_screen.screen_sqlite(sql)

    def _reader_connect(self, path: Path) -> sqlite3.Connection:
        conn = sqlite_connect(path, readonly=True)  # never created, never written
        conn.set_authorizer(readonly_authorizer)
        return conn

    def _existing(self, url: str) -> Path:
        path = sqlite_path(url)
        if path is None or not path.is_file():
            raise UserError(f"no database at {path} (run a sweep first, or pass --db)")
        return path

    def reader_engine(self, url: str, *, pool_size: int = READER_POOL) -> Engine:
        # mode=ro and the read-only authorizer on every pooled connection: no WAL pragma, no
        # checkpoint, no write of any kind reaches the file. A file URL and a QueuePool: each
        # thread checks out a connection of its own (a bare `sqlite://` would get the
        # SingletonThreadPool, which closes connections other threads still use once more
        # than its five threads read). The progress handler interrupts a statement whose
        # thread's deadline has passed.
        path = self._existing(url)

        def connect() -> sqlite3.Connection:
            conn = self._reader_connect(path)
            conn.set_progress_handler(_past_deadline, 1000)
            return conn

        return sa.create_engine(
            sqlite_url(path),
            creator=connect,
            poolclass=sa.pool.QueuePool,
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_timeout=30,
        )

    def fetch_arrays(self, url: str, sql: str, dtypes: Mapping[str, Any]) -> dict[str, Any] | None:
        # Arrow's SQLite driver (ADBC) builds the columns in C, where sqlite3 builds a Python
        # tuple a row: 5 million eval rows in 2.5-2.9 s of CPU instead of 5.8. It types each column
        # from the first rows it reads, and a column whose first rows are all NULL would be
        # typed INT64 and then fail at its first REAL: so a first row of the right types
        # (flagged, and dropped here) leads, and CASTs keep every other row to those types.
        try:
            from adbc_driver_sqlite import dbapi as adbc
        except ImportError:
            return None
        import numpy as np

        path = self._existing(url)
        names = list(dtypes)
        kinds = {n: "REAL" if np.dtype(dtypes[n]).kind == "f" else "INTEGER" for n in names}
        first = ", ".join(f"CAST(0 AS {kinds[n]})" for n in names)
        rest = ", ".join(f'CAST(q."{n}" AS {kinds[n]})' for n in names)
        query = f"SELECT 0, {first} UNION ALL SELECT 1, {rest} FROM ({sql}) AS q"
        conn = adbc.connect(sqlite_uri(path, readonly=True))
        try:
            cur = conn.cursor()
            try:
                cur.execute(query)
                table = cur.fetch_arrow_table()
            finally:
                cur.close()
        finally:
            conn.close()
        real = table.column(0).to_numpy() == 1
        out: dict[str, Any] = {}
        for i, n in enumerate(names):
            col, want = table.column(i + 1), np.dtype(dtypes[n])
            if want.kind != "f" and col.null_count:
                raise ValueError(f"column {n!r} holds NULL where {want} was asked for")
            out[n] = col.to_numpy()[real].astype(want, copy=False)
        return out

    def readonly_query(self, url: str, body: str, *, timeout_s: float, limits: Limits) -> Fetched:
        # mode=ro plus an authorizer that denies writes, ATTACH and assigning PRAGMAs; a
        # progress handler interrupts a query past its deadline; SQLite itself refuses to
        # build a value larger than the byte limit (randomblob(1e9) would take 40 s to show).
        path = self._existing(url)
        try:
            conn = self._reader_connect(path)
        except sqlite3.Error as exc:
            raise UserError(f"cannot open database {path}: {exc}") from None
        deadline = min(time.monotonic() + timeout_s, limits.deadline)
        timed_out = False

        def _progress() -> int:
            nonlocal timed_out
            timed_out = time.monotonic() > deadline
            return 1 if timed_out else 0

        try:
            # (the limit also bounds a stored row, hence the floor)
            set_length_limit(conn, min(max(limits.max_bytes, 16 << 20), 2**31 - 1))
            conn.set_progress_handler(_progress, 10_000)
            try:
                cur = conn.execute(body)
                cols = [d[0] for d in cur.description or ()]
                rows, cut = collect(iter(cur.fetchone, None), limits)
            except sqlite3.Warning as exc:  # e.g. "You can only execute one statement"
                raise UserError(f"query refused: {exc}") from None
            except sqlite3.DatabaseError as exc:
                if timed_out:
                    raise UserError(
                        f"query cancelled after the {timeout_s:g} s timeout (--timeout to change)"
                    ) from None
                if "not authorized" in str(exc) or "readonly" in str(exc):
                    raise UserError(f"refused: `orchestrator sql` is read-only ({exc})") from None
                if "too big" in str(exc):
                    raise UserError(
                        f"query refused: it builds a value larger than {max(limits.max_bytes, 16 << 20):,} bytes "
                        "(--max-bytes to change)"
                    ) from None
                raise UserError(f"query failed: {exc}") from None
            return Fetched(cols, rows, cut)
        finally:
            conn.close()


class PostgreSQL(Dialect):
    name = "postgresql"
    prefixes = ("postgresql",)
    schemes = ("postgresql", "postgres")
    reader_roles = True

    def route(self, url: str) -> str | None:
        # psycopg 3 is the driver; libpq's short scheme is accepted too.
        if url.startswith(tuple(f"{s}://" for s in self.schemes)):
            return "postgresql+psycopg://" + url.split("://", 1)[1]
        return super().route(url)

    def make_engine(self, url: str, *, create_dir: bool = True) -> Engine:
        try:
            return sa.create_engine(url, pool_pre_ping=True)
        except Exception as exc:  # e.g. missing driver, malformed URL
            raise UserError(f"database URL {describe(url)!r}: {exc}") from exc

    bulk_load_name = "COPY"

    def clone_table(self, conn, source, target, *, foreign_keys) -> None:
        conn.exec_driver_sql(f"CREATE TABLE {target} (LIKE {source} INCLUDING ALL)")
        if foreign_keys:
            refs = conn.exec_driver_sql(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                f"WHERE conrelid = '{source}'::regclass AND contype = 'f'"
            ).scalars()
            for ref in list(refs):
                conn.exec_driver_sql(f"ALTER TABLE {target} ADD {ref}")

    def bulk_load(self, conn, table, fields, batch) -> None:
        with conn.connection.driver_connection.cursor() as cur:
            with cur.copy(f"COPY {table} ({', '.join(fields)}) FROM STDIN") as copy:
                for row in batch:
                    copy.write_row(row)

    def database_bytes(self, conn: Any) -> int:
        return int(
            conn.execute(
                sa.text(
                    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'm')"
                )
            ).scalar_one()
        )

    def skip_locked(self, stmt: sa.Select) -> sa.Select:
        return stmt.with_for_update(skip_locked=True)

    # undefined_table (its schema or tables dropped), invalid_schema_name, invalid_catalog_name
    # (the database dropped).
    _GONE_SQLSTATES = frozenset({"42P01", "3F000", "3D000"})

    def is_gone(self, orig: BaseException) -> bool:
        return getattr(orig, "sqlstate", None) in self._GONE_SQLSTATES

    def now_plus(self, seconds: float) -> Any:
        return sa.literal_column(f"(now() + interval '{float(seconds):.3f} seconds')", type_=sa.DateTime(timezone=True))

    def _insert(self, table: Any) -> Any:
        from sqlalchemy.dialects.postgresql import insert

        return insert(table)

    # Batches up to this many rows go as one multi-row INSERT rather than through COPY.
    SMALL_BATCH = 64

    def upsert(self, conn, table, fields, set_clause, batch) -> None:
        # Nearly every large batch holds only rows new to the table: they are COPYed straight in
        # (the bulk load itself), under a savepoint. A batch that re-sends a stored row (a
        # flush retried after an outage, a re-import) fails on the primary key there, is
        # rolled back to the savepoint and goes again the way that replaces: COPY into a
        # staging table and one INSERT ... ON CONFLICT (slower than the COPY alone; row-at-
        # a-time upserts manage a fraction of either).
        from psycopg.errors import UniqueViolation

        cols = ", ".join(fields)
        if len(batch) <= self.SMALL_BATCH:
            # A flush of a few rows (a short trial's, a timer's): one INSERT ... ON CONFLICT,
            # one statement where the savepoint and the COPY are three (issue 34).
            row = f"({', '.join('%s' for _ in fields)})"
            with conn.connection.driver_connection.cursor() as cur:
                cur.execute(
                    f"INSERT INTO {table} ({cols}) VALUES {', '.join(row for _ in batch)} "
                    f"ON CONFLICT (trial_id, step) DO UPDATE SET {set_clause}",
                    [x for r in batch for x in r],
                )
            raw_statements.sent += 1
            return
        with conn.connection.driver_connection.cursor() as cur:
            cur.execute("SAVEPOINT orch_upsert")
            try:
                with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                    for row in batch:
                        copy.write_row(row)
            except UniqueViolation:
                cur.execute("ROLLBACK TO SAVEPOINT orch_upsert")
                self._staged_upsert(cur, table, cols, set_clause, batch)
                raw_statements.sent += 5  # the rollback, and the staged upsert's four
            cur.execute("RELEASE SAVEPOINT orch_upsert")
        raw_statements.sent += 3

    def _staged_upsert(self, cur: Any, table: str, cols: str, set_clause: str, batch: Sequence[tuple]) -> None:
        # A temporary table of the session, emptied at commit; emptied here too, for a
        # second upsert into the same table before that commit.
        stage = f"_{table}_in"
        cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
        with cur.copy(f"COPY {stage} ({cols}) FROM STDIN") as copy:
            for row in batch:
                copy.write_row(row)
        cur.execute(
            f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {stage} "
            f"ON CONFLICT (trial_id, step) DO UPDATE SET {set_clause}"
        )
        cur.execute(f"TRUNCATE {stage}")

    def screen(self, sql: str) -> None:
        sql_screen.screen_postgresql(sql)

    def _pooled(self, url: str, pool_size: int) -> Engine:
        try:
            return sa.create_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=pool_size)
        except Exception as exc:  # e.g. missing driver, malformed URL
            raise UserError(f"database URL {describe(url)!r}: {exc}") from exc

    def reader_engine(self, url: str, *, pool_size: int = READER_POOL) -> Engine:
        # A superuser (or a member of the server-acting roles) can run programs and read
        # server files even in a READ ONLY transaction, and SET ROLE from such a session is
        # undone by set_config('role', ...) inside a SELECT: so a privileged URL reads by
        # logging in as a reader role instead (one `db create-reader` made), or is refused.
        engine = self._pooled(url, pool_size)
        try:
            with engine.connect() as conn:
                who, why = _privileged(conn)
                if why is None:
                    return _read_only_sessions(engine)
                readers = _readers(conn)
        except sa.exc.OperationalError as exc:
            engine.dispose()
            raise UserError(f"cannot open database {describe(url)}: {_first_line(exc.orig)}") from None
        except UserError:
            engine.dispose()
            raise
        engine.dispose()
        fix = (
            "create a read-only role once with `orchestrator db create-reader NAME --db URL` "
            "(reads then log in as it), or pass the URL of a role without those rights"
        )
        if not readers:
            raise UserError(f"refused: the URL connects as {who!r}, {why}; {fix}")
        reader = readers[0]
        rurl = sa.engine.make_url(url).set(username=reader, password=None).render_as_string(hide_password=False)
        engine = self._pooled(rurl, pool_size)
        try:
            with engine.connect() as conn:
                _, rwhy = _privileged(conn)
        except sa.exc.OperationalError as exc:
            engine.dispose()
            raise UserError(
                f"refused: the URL connects as {who!r}, {why}, and logging in as the read-only role {reader!r} "
                f"failed ({_first_line(exc.orig)}); put its password in ~/.pgpass or pass its URL with --db"
            ) from None
        if rwhy is not None:
            engine.dispose()
            raise UserError(f"refused: the read-only role {reader!r} is not read-only ({rwhy}); {fix}")
        return _read_only_sessions(engine)

    def readonly_query(self, url: str, body: str, *, timeout_s: float, limits: Limits) -> Fetched:
        # A READ ONLY transaction with a statement_timeout, as a reader; the extended query
        # protocol refuses stacked statements; rows are streamed, so a huge result is cut at
        # the limits instead of being held whole.
        engine = self.reader_engine(url)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                remaining = min(timeout_s, limits.deadline - time.monotonic())
                conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, int(remaining * 1000))}")
                # The screen parsed the statement with this rule ('\' is a whole string).
                conn.exec_driver_sql("SET LOCAL standard_conforming_strings = on")
                # Take the snapshot now: after it, `SET TRANSACTION READ WRITE` is an error.
                conn.exec_driver_sql("SELECT 1")
                raw = conn.connection.driver_connection
                assert raw is not None  # a checked-out connection always has one
                import psycopg

                try:
                    with raw.cursor() as cur:
                        stream = cur.stream(body)
                        try:
                            first = next(stream, None)
                            cols = [d.name for d in cur.description or ()]
                            head = iter(()) if first is None else iter((first,))
                            rows, cut = collect(itertools.chain(head, stream), limits)
                        finally:
                            stream.close()  # cancels what is still coming
                except UserError:
                    raise
                except Exception as exc:
                    raw.rollback()
                    msg = _first_line(exc)
                    if getattr(exc, "sqlstate", None) == "57014":  # query_canceled
                        raise UserError(
                            f"query cancelled after the {timeout_s:g} s timeout (--timeout to change)"
                        ) from None
                    if getattr(exc, "sqlstate", None) in ("25006", "42501"):
                        raise UserError(f"refused: `orchestrator sql` is read-only ({msg})") from None
                    if isinstance(exc, psycopg.OperationalError) and raw.closed:
                        raise UserError(f"query ended the database session: {msg}") from None
                    raise UserError(f"query failed: {msg}") from None
                # COMMIT/ROLLBACK as the statement would end the read-only transaction (the
                # screen refuses them first). Rows cut at a limit were cancelled on the
                # server, which leaves the transaction failed: expected, and rolled back.
                status = raw.info.transaction_status
                ok = (psycopg.pq.TransactionStatus.INTRANS,) + ((psycopg.pq.TransactionStatus.INERROR,) if cut else ())
                if status not in ok:
                    raise UserError(
                        "refused: transaction control is not allowed in `orchestrator sql` (it is read-only)"
                    )
                conn.rollback()
                return Fetched(cols, rows, cut)
        except sa.exc.OperationalError as exc:
            raise UserError(f"cannot open database {describe(url)}: {_first_line(exc.orig)}") from None
        finally:
            engine.dispose()


def _first_line(exc: BaseException | None) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _privileged(conn: Connection) -> tuple[str, str | None]:
    """(current role, why it is more than a reader, or None when it is one)."""
    row = conn.execute(
        sa.text(
            "SELECT current_user, rolsuper, rolcreaterole, rolreplication, rolbypassrls "
            "FROM pg_roles WHERE rolname = current_user"
        )
    ).one()
    who = str(row[0])
    attrs = [n for n, v in zip(("a superuser", "CREATEROLE", "REPLICATION", "BYPASSRLS"), row[1:]) if v]
    held = list(
        conn.execute(
            sa.text(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(:names) "
                "AND pg_has_role(current_user, oid, 'MEMBER') ORDER BY rolname"
            ),
            {"names": list(PG_ADMIN_ROLES)},
        ).scalars()
    )
    if not row[1] and held:  # a superuser is a member of every role: saying so adds nothing
        attrs.append("a member of " + ", ".join(held))
    if not attrs:
        return who, None
    return who, " and ".join(attrs) + " (it could run programs or touch files on the server)"


def _readers(conn: Connection) -> list[str]:
    """Login roles ``db create-reader`` made that can read this schema's sweeps, and no more."""
    names = conn.execute(
        sa.text(
            "SELECT r.rolname FROM pg_roles r "
            "JOIN pg_shdescription d ON d.objoid = r.oid AND d.classoid = 'pg_authid'::regclass "
            "WHERE d.description = :marker AND r.rolcanlogin AND NOT r.rolsuper AND NOT r.rolcreaterole "
            "AND NOT r.rolreplication AND NOT r.rolbypassrls "
            "AND has_table_privilege(r.oid, to_regclass('sweeps'), 'SELECT') "
            "AND NOT EXISTS (SELECT 1 FROM pg_roles a WHERE a.rolname = ANY(:admin) "
            "AND pg_has_role(r.oid, a.oid, 'MEMBER')) "
            "ORDER BY r.rolname"
        ),
        {"marker": READER_COMMENT, "admin": list(PG_ADMIN_ROLES)},
    ).scalars()
    return [str(n) for n in names]


def _read_only_sessions(engine: Engine) -> Engine:
    @sa.event.listens_for(engine, "connect")
    def _ro(dbapi_conn, _record) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        dbapi_conn.commit()

    @sa.event.listens_for(engine, "begin")
    def _deadline(conn: Connection) -> None:
        # Each transaction's statements get what is left of the thread's deadline (SET LOCAL
        # ends with the transaction); the server cancels one that runs past it. Under a
        # deadline.Stop, the connection's running statement is also cancelled when it is set.
        raw = conn.connection.dbapi_connection
        assert raw is not None
        stop = deadline.current_stop()
        if stop is not None:
            stop.register(id(raw), getattr(raw, "cancel_safe", None) or raw.cancel)
            conn.connection.info["orch_stop"] = stop
        left = deadline.remaining()
        if left is not None:
            cur = raw.cursor()
            try:
                cur.execute(f"SET LOCAL statement_timeout = {max(1, int(left * 1000))}")
            finally:
                cur.close()

    @sa.event.listens_for(engine, "checkin")
    def _forget(dbapi_conn, record) -> None:
        stop = record.info.pop("orch_stop", None)
        if stop is not None:
            stop.unregister(id(dbapi_conn))

    engine.pool.dispose()  # a connection opened before the listener would be read-write
    return engine


DIALECTS: tuple[Dialect, ...] = (SQLite(), PostgreSQL())


# A plain path (no scheme) is a file of this backend.
FILE_DIALECT: Dialect = DIALECTS[0]


def for_value(value: str) -> Dialect | None:
    """The backend of a ``--db``/``storage:`` value: a path is a file; None for a URL no backend takes."""
    if "://" not in value:
        return FILE_DIALECT
    for d in DIALECTS:
        if re.match(rf"({'|'.join(d.schemes)})(\+\w+)?://", value):
            return d
    return None


def storage_problem(value: str) -> str | None:
    """Why ``value`` (a ``--db``/``storage:``/``$ORCH_DB`` value) cannot hold results, or None.

    An empty value would fall back to another database, and an in-memory SQLite database
    (``sqlite://``, ``sqlite:///:memory:``, ``file::memory:``, ``mode=memory``) is gone when the
    driver exits: both would report success while storing nothing anyone can query."""
    if not value.strip():
        return "is empty: give a file path, sqlite:///PATH or postgresql://HOST/DB"
    backend = for_value(value)
    return backend.storage_problem(value) if backend is not None else None


def route_url(url: str) -> str:
    """The SQLAlchemy URL of a ``--db`` value: a plain path is a SQLite file; each backend
    routes its own schemes (``postgresql://`` to psycopg 3); any other scheme is refused."""
    if "://" not in url:
        return sqlite_url(url)
    for d in DIALECTS:
        routed = d.route(url)
        if routed is not None:
            return routed
    raise UserError(f"database URL {url!r}: expected a file path, sqlite:///PATH or postgresql://HOST/DB")


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
