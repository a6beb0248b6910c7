"""Read-only SQL for ``orchestrator sql``: a write is refused and the database untouched.

Three locks, any one of which suffices: a statement check (one statement, starting with a
reading keyword), the connection itself (SQLite opened with ``mode=ro`` plus an authorizer
that denies writes, ATTACH and assigning PRAGMAs; PostgreSQL in a READ ONLY transaction),
and, on PostgreSQL, the extended query protocol, which refuses stacked statements.
"""
from __future__ import annotations

import re
import sqlite3
from typing import Any

import sqlalchemy as sa

from orchestrator.errors import UserError
from orchestrator.store.engine import describe, make_engine, sqlite_path

_READING = ("select", "with", "values", "explain", "show", "table", "pragma")
# Pragmas that only read (a pragma with an argument or `= value` sets something).
_READ_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_list", "index_info",
                 "index_xinfo", "foreign_key_list", "database_list", "compile_options",
                 "user_version", "schema_version", "application_id", "page_count",
                 "page_size", "journal_mode", "function_list", "pragma_list", "collation_list",
                 "freelist_count", "encoding"}
_DENY = sqlite3.SQLITE_DENY
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                    sqlite3.SQLITE_RECURSIVE}


def _strip_comments(sql: str) -> str:
    sql = re.sub(r"/\*.*?\*/", " ", sql, flags=re.S)
    return re.sub(r"--[^\n]*", " ", sql)


def check_statement(sql: str) -> str:
    """The one statement in ``sql`` (a trailing semicolon allowed), or UserError."""
    body = _strip_comments(sql).strip().rstrip(";").strip()
    if not body:
        raise UserError("empty query")
    if ";" in body.replace("';'", ""):
        # A semicolon inside a string literal is legal SQL; anything else is a second statement.
        quoted = re.sub(r"'(?:[^']|'')*'", "''", body)
        if ";" in quoted:
            raise UserError("one statement at a time: `orchestrator sql` is read-only")
    first = body.split(None, 1)[0].lower()
    if first not in _READING:
        raise UserError(f"refused: {first.upper()} is not a read; `orchestrator sql` is read-only")
    if first == "pragma":
        m = re.match(r"pragma\s+(?:\w+\.)?(\w+)\s*(=|\()?", body, flags=re.I)
        name = m.group(1).lower() if m else ""
        if not m or m.group(2) == "=" or name not in _READ_PRAGMAS:
            raise UserError(f"refused: PRAGMA {name or '?'} may write; only reading pragmas "
                            "are allowed")
    return body


def _authorizer(action: int, arg1, arg2, dbname, source) -> int:
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and arg2 is None and (arg1 or "").lower() in _READ_PRAGMAS:
        return sqlite3.SQLITE_OK
    return _DENY


def readonly_query(url: str, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one reading statement; returns (column names, rows)."""
    body = check_statement(sql)
    path = sqlite_path(url)
    if url.startswith("sqlite"):
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
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            raw = conn.connection.driver_connection
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
