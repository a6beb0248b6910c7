"""Read-only SQL for ``orchestrator sql``: a write is refused and the database untouched.

The statement goes to the database exactly as the user wrote it. Read-only-ness comes from
the connection: SQLite opened with ``mode=ro`` plus an authorizer that denies writes,
ATTACH and assigning PRAGMAs; PostgreSQL in a READ ONLY transaction, logged in as a role
with a reader's rights whatever role the URL names (see ``Dialect.reader_engine`` and
``orchestrator db create-reader``). The backend's screen (``store/sql_screen.py``) looks
at the statement first: exactly one, a read (PostgreSQL's parsed by PostgreSQL's own parser,
calling only read functions, however spelled). Both backends
cancel a statement past its timeout, and the rows brought back are capped.
"""

from __future__ import annotations

import math
import time

from orchestrator.errors import UserError, utf8_problem
from orchestrator.store import dialect, sql_screen
from orchestrator.store.dialect import DEFAULT_QUERY_TIMEOUT_S, READER_COMMENT, Fetched, Limits


# statement_timeout is a 32-bit count of milliseconds: a longer --timeout cannot be set.
MAX_TIMEOUT_S = (2**31 - 1) // 1000


def check_statement(sql: str, backend: dialect.Dialect | None = None) -> str:
    """``sql`` itself, unchanged, when it holds exactly one statement that ``backend``'s
    screen lets through (``store/sql_screen.py``: one reading statement, PostgreSQL's parsed
    by its own parser and calling read functions only); else UserError. Without a backend
    only the one-statement rule applies."""
    if backend is None:
        sql_screen.one_statement(sql)
    else:
        backend.screen(sql)
    return sql


def readonly_query(
    url: str,
    sql: str,
    *,
    timeout_s: float = DEFAULT_QUERY_TIMEOUT_S,
    max_rows: int = Limits.max_rows,
    max_bytes: int = Limits.max_bytes,
) -> Fetched:
    """Run one statement read-only with a reader's rights; returns its columns and at most
    ``max_rows`` rows / ``max_bytes`` of values (``cut`` says when more were left out).
    ``Fetched.deadline`` is the timeout's end: the caller formats the rows within it."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise UserError(f"--timeout must be a positive number of seconds, got {timeout_s}")
    if timeout_s > MAX_TIMEOUT_S:
        raise UserError(
            f"--timeout must be at most {MAX_TIMEOUT_S:,} seconds (PostgreSQL's longest statement timeout, "
            f"about 24 days), got {timeout_s:.15g}"
        )
    if max_rows < 0 or max_bytes < 1:
        raise UserError(f"--max-rows must be >= 0 and --max-bytes >= 1 (got {max_rows}, {max_bytes})")
    bad = utf8_problem(sql, "the query")
    if bad:
        raise UserError(bad)
    backend = dialect.for_url(url)
    body = check_statement(sql, backend)
    limits = Limits(max_rows=max_rows, max_bytes=max_bytes, deadline=time.monotonic() + timeout_s)
    fetched = backend.readonly_query(url, body, timeout_s=timeout_s, limits=limits)
    fetched.deadline = limits.deadline
    return fetched


# ---- a read-only PostgreSQL role -----------------------------------------------------------

_ROLE_NAME = r"^[a-z_][a-z0-9_]{0,62}$"

# Role changes (CREATE ROLE, GRANT CONNECT ON DATABASE, DROP OWNED BY) update rows of shared
# catalogs: two sessions making readers at once fail with "tuple concurrently updated". Each
# takes this advisory lock first (anyone dropping such roles should too).
ROLE_DDL_LOCK = 8_311_043_705


def reader_sql(
    role: str, database: str, schema: str, *, timeout_s: float = DEFAULT_QUERY_TIMEOUT_S, with_password: bool = False
) -> list[str]:
    """The statements that make ``role`` a login role that can only read ``schema``: SELECT
    on its tables (present and future), every transaction read-only by default, a statement
    timeout. Being no superuser and holding no ``pg_*`` admin roles, it cannot run
    pg_terminate_backend on others' sessions, pg_reload_conf, pg_stat_reset, pg_read_file
    or server-side lo_import (PostgreSQL grants those to superusers only)."""
    import re

    if not re.match(_ROLE_NAME, role):
        raise UserError(
            f"role name {role!r}: use lower-case letters, digits and _ (at most 63, not starting with a digit)"
        )
    q = f'"{role}"'
    db = '"' + database.replace('"', '""') + '"'
    sch = '"' + schema.replace('"', '""') + '"'
    return [
        f"CREATE ROLE {q} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION"
        + (" PASSWORD %(password)s" if with_password else ""),
        f"GRANT CONNECT ON DATABASE {db} TO {q}",
        f"GRANT USAGE ON SCHEMA {sch} TO {q}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {sch} TO {q}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {sch} GRANT SELECT ON TABLES TO {q}",
        f"ALTER ROLE {q} SET default_transaction_read_only = on",
        f"ALTER ROLE {q} SET statement_timeout = {int(timeout_s * 1000)}",
        # the mark `sql` and `ui` look for when a URL names a privileged role
        f"COMMENT ON ROLE {q} IS '{READER_COMMENT}'",
    ]


def create_reader(
    url: str, role: str, *, password: str | None = None, timeout_s: float = DEFAULT_QUERY_TIMEOUT_S
) -> list[str]:
    """Create the read-only ``role`` on the PostgreSQL database of ``url`` (run as a role
    allowed to create roles); returns the statements run (the password not shown)."""
    import psycopg
    import sqlalchemy as sa

    backend = dialect.for_url(url)
    if not backend.reader_roles:
        raise UserError(
            "db create-reader is for PostgreSQL; a SQLite file is made read-only "
            "by its file permissions (chmod a-w), and `orchestrator sql` opens it "
            "read-only anyway"
        )
    engine = backend.make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": ROLE_DDL_LOCK})
            database, schema = conn.execute(sa.text("SELECT current_database(), current_schema()")).one()
            stmts = reader_sql(role, database, schema, timeout_s=timeout_s, with_password=password is not None)
            raw = conn.connection.driver_connection
            assert raw is not None
            from psycopg import sql as psql

            with raw.cursor() as cur:
                for st in stmts:
                    if "%(password)s" in st:  # utility statements take no bind parameters
                        head, tail = st.split("%(password)s")
                        cur.execute(psql.SQL(head) + psql.Literal(password) + psql.SQL(tail))
                    else:
                        cur.execute(st)
    except (sa.exc.DBAPIError, psycopg.Error) as exc:
        orig = getattr(exc, "orig", None) or exc
        msg = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        raise UserError(f"cannot create role {role!r}: {msg}") from None
    finally:
        engine.dispose()
    return [st.replace("%(password)s", "'***'") for st in stmts]
