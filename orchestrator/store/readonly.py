"""Read-only SQL for ``orchestrator sql``: a write is refused and the database untouched.

Three locks, any one of which suffices: a statement check (one statement, starting with a
reading keyword), the connection itself (SQLite opened with ``mode=ro`` plus an authorizer
that denies writes, ATTACH and assigning PRAGMAs; PostgreSQL in a READ ONLY transaction),
and, on PostgreSQL, the extended query protocol, which refuses stacked statements.
"""
from __future__ import annotations

import re
from typing import Any

from orchestrator.errors import UserError
from orchestrator.store import dialect

_READING = ("select", "with", "values", "explain", "show", "table", "pragma")
# Pragmas that only read (a pragma with an argument or `= value` sets something).
_READ_PRAGMAS = dialect.READ_PRAGMAS


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


def readonly_query(url: str, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one reading statement; returns (column names, rows)."""
    body = check_statement(sql)
    return dialect.for_url(url).readonly_query(url, body)
