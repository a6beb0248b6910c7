"""``--where``: a SQL condition on trial parameters, evaluated away from the store.

The trials' flattened parameters are copied into a private in-memory SQLite table and the
condition runs there as ``SELECT trial_id FROM trials WHERE (<condition>)``. So the same
condition means the same thing on SQLite and PostgreSQL stores, and it cannot touch the
store: the in-memory connection knows nothing else, runs one statement only, and an
authorizer refuses everything but reading that table and calling functions.

Column names: every parameter under its full dotted name (quote it: ``"task.vocab_size"``),
its short name when unique (``vocab_size``), its name with dots as underscores
(``task_vocab_size``), plus ``trial_id``, ``key`` and ``status``.
"""

from __future__ import annotations

import sqlite3
import time

import pandas as pd

from orchestrator.errors import UserError, utf8_problem
from orchestrator.store import deadline as request_deadline
from orchestrator.store.dialect import set_length_limit

_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
# Functions that reach outside the table: fts3_tokenizer hands out (and takes) a pointer.
_DENIED_FUNCTIONS = {"fts3_tokenizer", "load_extension", "sqlite_compileoption_get", "sqlite_compileoption_used"}


def _authorize(action: int, arg1, arg2, *_args) -> int:
    if action == sqlite3.SQLITE_FUNCTION and str(arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


def _columns(frame: pd.DataFrame) -> list[str]:
    """The table's columns: SQLite's names are case-insensitive, so of names that differ
    only in case the short aliases are dropped (neither is unique any more: ``K`` of
    ``task.K`` and ``k`` of ``tag.k``) and full names that still collide are refused."""
    columns = list(dict.fromkeys(frame.columns))
    groups: dict[str, list[str]] = {}
    for c in columns:
        groups.setdefault(c.lower(), []).append(c)
    drop: set[str] = set()
    for names in groups.values():
        if len(names) < 2:
            continue
        full = [n for n in names if "." in n]
        drop.update(n for n in names if "." not in n)
        if len(full) > 1:
            raise UserError(
                f"--where: parameters {full[0]!r} and {full[1]!r} differ only in case; SQL cannot tell them apart"
            )
    return [c for c in columns if c not in drop]


def _sql_value(v):
    if v is None or (isinstance(v, float) and v != v):
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float, str)):
        return v
    if hasattr(v, "item"):  # numpy scalars
        return _sql_value(v.item())
    return str(v)


def _check_shape(condition: str) -> None:
    """One self-contained expression: parentheses balanced outside quotes and no comments,
    so a condition cannot close the WHERE clause and append a query of its own."""
    depth, i, n = 0, 0, len(condition)
    while i < n:
        ch = condition[i]
        if ch in "'\"`[":
            close = "]" if ch == "[" else ch
            j = condition.find(close, i + 1)
            while j != -1 and close != "]" and condition[j + 1 : j + 2] == close:
                j = condition.find(close, j + 2)  # doubled quote inside a literal
            if j == -1:
                raise UserError(f"--where {condition!r}: unterminated quote")
            i = j + 1
            continue
        if condition.startswith(("--", "/*"), i):
            raise UserError(f"--where {condition!r}: comments are not allowed")
        if ch == ";":
            raise UserError(f"--where {condition!r}: one condition, no ';'")
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            raise UserError(f"--where {condition!r}: unbalanced parentheses")
        i += 1
    if depth:
        raise UserError(f"--where {condition!r}: unbalanced parentheses")


# A condition runs over a few thousand short rows: a minute is generous, and no value it
# builds needs to be larger than this (zeroblob(1e9) per row would take the memory).
WHERE_TIMEOUT_S = 60.0
WHERE_MAX_VALUE_BYTES = 1 << 20


def filter_trial_ids(frame: pd.DataFrame, condition: str, *, timeout_s: float = WHERE_TIMEOUT_S) -> list[int]:
    """Ids (column ``trial_id`` of ``frame``) of the rows where ``condition`` holds, in frame
    order. A condition SQLite cannot run, or that runs past ``timeout_s``, is a one-line
    :class:`UserError`."""
    cond = condition.strip()
    if not cond:
        return [int(i) for i in frame["trial_id"]]
    bad = utf8_problem(cond, "--where")  # a lone surrogate (from argv or a JSON body) encodes nowhere
    if bad:
        raise UserError(bad)
    _check_shape(cond)
    columns = _columns(frame)
    con = sqlite3.connect(":memory:")
    try:
        col_sql = ", ".join('"' + c.replace('"', '""') + '"' for c in columns)
        con.execute(f"CREATE TABLE trials ({col_sql})")
        rows = [tuple(_sql_value(v) for v in rec) for rec in frame[columns].itertuples(index=False, name=None)]
        con.executemany(f"INSERT INTO trials VALUES ({', '.join('?' * len(columns))})", rows)
        con.set_authorizer(_authorize)
        longest = max((len(v) for r in rows for v in r if isinstance(v, str)), default=0)
        set_length_limit(con, max(WHERE_MAX_VALUE_BYTES, 2 * longest))
        # The caller's own deadline when it is sooner (a dashboard request's, or its
        # server stopping): the condition runs here, not on the reader engine that honours it.
        left = request_deadline.remaining()
        if left is not None:
            timeout_s = max(0.0, min(timeout_s, left))
        deadline = time.monotonic() + timeout_s
        con.set_progress_handler(lambda: 1 if time.monotonic() > deadline or request_deadline.passed() else 0, 10_000)
        try:
            cur = con.execute(f"SELECT trial_id FROM trials WHERE ({cond})")
            keep = {int(r[0]) for r in cur.fetchall()}
        except (sqlite3.Error, sqlite3.Warning) as exc:
            if time.monotonic() > deadline:
                raise UserError(f"--where {condition!r}: cancelled after {timeout_s:g} s") from None
            msg = str(exc).splitlines()[0]
            hint = ""
            if "no such column" in msg:
                shown = [c for c in columns if c not in ("trial_id", "key")][:40]
                hint = f" (columns: {', '.join(shown)})"
            raise UserError(f"--where {condition!r}: {msg}{hint}") from None
    finally:
        con.close()
    return [int(i) for i in frame["trial_id"] if int(i) in keep]
