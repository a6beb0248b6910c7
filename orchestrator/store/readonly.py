"""Read-only SQL for ``orchestrator sql``: a write is refused and the database untouched.

The statement goes to the database exactly as the user wrote it. Read-only-ness comes from
the connection: SQLite opened with ``mode=ro`` plus an authorizer that denies writes,
ATTACH and assigning PRAGMAs; PostgreSQL in a READ ONLY transaction (and, for the admin
functions a READ ONLY transaction still allows, a role without those rights: see
``orchestrator db create-reader``). A SQL tokenizer (sqlparse) is used for one thing only:
refusing stacked statements, with quotes, comments and ``$$`` strings understood.
Both backends cancel a statement past its timeout.
"""

from __future__ import annotations

import math
from typing import Any

import sqlparse

from orchestrator.errors import UserError
from orchestrator.store import dialect
from orchestrator.store.dialect import DEFAULT_QUERY_TIMEOUT_S


def _meaningful(stmt: str) -> bool:
    """Whether a piece of a split holds more than whitespace, comments and semicolons."""
    for tok in sqlparse.parse(stmt)[0].flatten() if stmt.strip() else ():
        if (
            tok.is_whitespace
            or tok.ttype in sqlparse.tokens.Comment
            or tok.ttype in sqlparse.tokens.Comment.Single
            or tok.ttype in sqlparse.tokens.Comment.Multiline
            or (tok.ttype is sqlparse.tokens.Punctuation and tok.value == ";")
        ):
            continue
        return True
    return False


def check_statement(sql: str) -> str:
    """``sql`` itself, unchanged, when it holds exactly one statement; else UserError."""
    if not sql.strip():
        raise UserError("empty query")
    pieces = [p for p in sqlparse.split(sql) if _meaningful(p)]
    if not pieces:
        raise UserError("empty query (only comments)")
    if len(pieces) > 1:
        raise UserError(
            f"one statement at a time ({len(pieces)} given): `orchestrator sql` runs a single read-only statement"
        )
    return sql


def readonly_query(
    url: str, sql: str, *, timeout_s: float = DEFAULT_QUERY_TIMEOUT_S
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one statement read-only; returns (column names, rows)."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise UserError(f"--timeout must be a positive number of seconds, got {timeout_s}")
    body = check_statement(sql)
    return dialect.for_url(url).readonly_query(url, body, timeout_s=timeout_s)


# ---- a read-only PostgreSQL role -----------------------------------------------------------

_ROLE_NAME = r"^[a-z_][a-z0-9_]{0,62}$"


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
    ]


def create_reader(
    url: str, role: str, *, password: str | None = None, timeout_s: float = DEFAULT_QUERY_TIMEOUT_S
) -> list[str]:
    """Create the read-only ``role`` on the PostgreSQL database of ``url`` (run as a role
    allowed to create roles); returns the statements run (the password not shown)."""
    import psycopg
    import sqlalchemy as sa

    if dialect.for_url(url).name != "postgresql":
        raise UserError(
            "db create-reader is for PostgreSQL; a SQLite file is made read-only "
            "by its file permissions (chmod a-w), and `orchestrator sql` opens it "
            "read-only anyway"
        )
    engine = dialect.for_url(url).make_engine(url)
    try:
        with engine.begin() as conn:
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
