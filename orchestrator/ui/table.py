"""The sweep page's trial table a page at a time, for a view past :data:`PAGED_TRIALS` trials.

A 100,000-trial table is 50 MB of JSON, and the browser sorting and drawing it was most of the
page's load. Past :data:`PAGED_TRIALS` trials the server sorts the (cached) table and hands out
one page (:func:`page`), and the rows the page needs off its current page (the overlay's, a
grid cell's) by trial id or key (:func:`picked`).

The order is the one ``sweep.js`` sorts a whole table in (:func:`sort_value`): numbers
numerically, strings as JavaScript compares them (UTF-16 code units), null last in both
directions; values of different kinds (numbers, strings, lists/dicts) kept apart, numbers
first when ascending; ties by key, so the pages of one order never overlap or skip a row.
Each sorted order is kept for the table it came from (:class:`_Orders`), so paging through
a table sorts it once.
"""

from __future__ import annotations

import json
import math
import threading
import weakref
from array import array
from collections import OrderedDict
from typing import Any

from orchestrator.errors import UserError

# A view with more trials than this is served a page at a time (one of this many is served
# whole, as before: the browser sorts and draws 5,000 rows quickly).
PAGED_TRIALS = 5000
PAGE_SIZE, MAX_PAGE_SIZE = 100, 1000
# Rows one ids/keys request names at most (no more than a whole unpaged view).
MAX_PICKED = PAGED_TRIALS
# The row columns a page sorts by; a parameter is ``params.NAME``.
ROW_COLUMNS = (
    "trial_id",
    "key",
    "status",
    "steps",
    "step",
    "final_acc",
    "final_loss",
    "best_acc",
    "error",
    "host",
    "device",
    "started_at",
    "updated_at",
)
PARAM_PREFIX = "params."
# Sorted orders kept (table, sort, dir): a few, each a list as long as its table.
ORDERS_KEPT = 6

_NUMBER, _STRING, _OTHER = 0, 1, 2


def _string(s: str) -> bytes:
    # JavaScript's < on strings compares UTF-16 code units; big-endian UTF-16 bytes compare alike.
    return s.encode("utf-16-be", "surrogatepass")


def sort_value(row: dict[str, Any], column: str) -> tuple[int, Any] | None:
    """What ``row`` sorts by in ``column`` (a row column or ``params.NAME``): None for a
    missing value (null, NaN, infinite: JSON shows them as null), else ``(kind, value)`` with
    numbers (booleans too: JavaScript compares them as 0 and 1) before strings before lists
    and dicts (as sorted JSON)."""
    if column.startswith(PARAM_PREFIX):
        params = row.get("params") or {}
        return value_key(params.get(column[len(PARAM_PREFIX) :]))
    return value_key(row.get(column))


def value_key(v: Any) -> tuple[int, Any] | None:
    """What a value sorts by (:func:`sort_value`)."""
    if v is None:
        return None
    if isinstance(v, (bool, int)):
        return (_NUMBER, int(v))
    if isinstance(v, float):
        return (_NUMBER, v) if math.isfinite(v) else None
    if isinstance(v, str):
        return (_STRING, _string(v))
    return (_OTHER, _string(json.dumps(v, sort_keys=True, default=str)))


class _Orders:
    """Sorted orders of tables (row indices, 8 bytes a row), the last :data:`ORDERS_KEPT`
    asked for. Keyed by the table's id with a weak reference to it checked on every hit: a
    table freed and its id reused by another never gets the old one's order, and a kept
    order holds neither its table nor its rows."""

    def __init__(self, size: int = ORDERS_KEPT) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.items: OrderedDict[tuple[int, str, int], tuple[weakref.ref, array]] = OrderedDict()

    def get(self, table: Any, sort: str, direction: int) -> array:
        key = (id(table), sort, direction)
        with self.lock:
            hit = self.items.get(key)
            if hit is not None and hit[0]() is table:
                self.items.move_to_end(key)
                return hit[1]
        order = array("q", _sorted(table, sort, direction))
        with self.lock:
            for k in [k for k, (ref, _o) in self.items.items() if ref() is None]:
                del self.items[k]  # a freed table's orders go first
            self.items[key] = (weakref.ref(table), order)
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return order


ORDERS = _Orders()


def _values(table: Any, sort: str) -> list[Any]:
    """The column ``sort`` (a row column or ``params.NAME``) of ``table``, one value a row."""
    if sort.startswith(PARAM_PREFIX):
        name = sort[len(PARAM_PREFIX) :]
        return [(p or {}).get(name) for p in table.columns["params"]]
    return table.columns[sort]


def _sorted(table: Any, sort: str, direction: int) -> list[int]:
    """The indices of ``table``'s rows in the order of ``sort``, ``direction``."""
    keys = table.columns["key"]
    # ASCII keys (the product's are hex) compare alike as code points and as UTF-16 units.
    ascii_keys = all(k.isascii() for k in keys)
    by_key = sorted(range(len(keys)), key=keys.__getitem__ if ascii_keys else lambda i: _string(keys[i]))
    if sort == "key":
        return by_key if direction > 0 else by_key[::-1]
    values = _values(table, sort)
    have: list[tuple[tuple[int, Any], int]] = []
    missing: list[int] = []
    for i in by_key:
        v = value_key(values[i])
        if v is None:
            missing.append(i)
        else:
            have.append((v, i))
    # Python's sort is stable, reversed or not: ties stay in key order.
    have.sort(key=lambda p: p[0], reverse=direction < 0)
    return [i for _v, i in have] + missing


def _whole(name: str, value: Any, default: int, lo: int, hi: int | None) -> int:
    if value is None or value == "":
        return default
    text = str(value)
    if isinstance(value, bool) or not (text.isascii() and text.isdigit() and len(text) < 10):
        raise UserError(f"{name}={text[:20]!r}: expected a whole number")
    n = int(text)
    if n < lo or (hi is not None and n > hi):
        span = f"{lo:,} to {hi:,}" if hi is not None else f"{lo:,} or more"
        raise UserError(f"{name}={n}: expected {span}")
    return n


def _column(table: Any, sort: str | None) -> str:
    if sort is None or sort == "":
        return "key"
    if sort in ROW_COLUMNS:
        return sort
    if sort.startswith(PARAM_PREFIX) and (sort[len(PARAM_PREFIX) :] in table.params or not len(table)):
        return sort
    raise UserError(
        f"sort={sort[:80]!r}: no such column; expected one of {', '.join(ROW_COLUMNS)} or params.NAME of a parameter"
    )


def page(
    table: Any, page: int | str | None = 0, size: int | str | None = PAGE_SIZE, sort: str | None = "key", dir: Any = 1
) -> dict[str, Any]:
    """Page ``page`` (from 0; past the last one, the last) of ``table``'s rows sorted by ``sort``
    (a row column or ``params.NAME``), ascending for ``dir`` 1, descending for -1, ``size``
    rows a page (1 to :data:`MAX_PAGE_SIZE`). Arguments may be the query's strings. Bad
    ones are a UserError naming the argument."""
    n_page = _whole("page", page, 0, 0, None)
    n_size = _whole("size", size, PAGE_SIZE, 1, MAX_PAGE_SIZE)
    d = "1" if dir is None or dir == "" else str(dir)
    if isinstance(dir, bool) or d not in ("1", "-1"):
        raise UserError(f"dir={d[:20]!r}: expected 1 (ascending) or -1 (descending)")
    direction = int(d)
    column = _column(table, sort)
    total = len(table)
    last = max(0, -(-total // n_size) - 1)
    n_page = min(n_page, last)
    order = ORDERS.get(table, column, direction)
    return {
        "paged": True,
        "total": total,
        "page": n_page,
        "size": n_size,
        "sort": column,
        "dir": direction,
        "rows": [table.row(i) for i in order[n_page * n_size : (n_page + 1) * n_size]],
        "params": table.params,
        "varying": table.varying,
        "default_by": table.default_by,
    }


def comma_ids(text: str, cap: int) -> list[int]:
    """``ids=1,2,3``: the trial ids, at most ``cap`` of them; a UserError for anything else."""
    parts = text.split(",") if text else []
    if len(parts) > cap:
        raise UserError(f"ids: {len(parts):,} trial ids, more than the {cap:,} one request takes")
    bad = next((p for p in parts if not (p.isascii() and p.isdigit() and len(p) < 19)), None)
    if bad is not None:
        raise UserError(f"ids: {bad[:20]!r} is not a trial id; expected ids=1,2,3")
    return [int(p) for p in parts]


def ids_arg(value: Any) -> list[int] | None:
    """``ids``: comma-separated trial ids (:func:`comma_ids`), or a JSON list of them (a
    string, or a list in a POST body); None when absent."""
    if value is None:
        return None
    items: Any = value
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("["):
            return comma_ids(text, MAX_PICKED)
        try:
            items = json.loads(text)
        except (ValueError, RecursionError):
            raise UserError("ids: not a JSON list; expected ids=1,2,3 or a JSON list of trial ids") from None
    if not isinstance(items, list):
        raise UserError("ids: expected ids=1,2,3 or a JSON list of trial ids")
    _cap("ids", len(items))
    out = []
    for v in items:
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            out.append(v)
        elif isinstance(v, str) and v.isascii() and v.isdigit() and len(v) < 19:
            out.append(int(v))
        else:
            raise UserError(f"ids: {str(v)[:20]!r} is not a trial id; expected ids=1,2,3 or a JSON list of them")
    return out


def keys_arg(value: Any) -> list[str] | None:
    """``keys``: a JSON list of trial keys (a string, or a list in a POST body); None when absent."""
    if value is None:
        return None
    items: Any = value
    if isinstance(value, str):
        try:
            items = json.loads(value)
        except (ValueError, RecursionError):
            items = None
    if not isinstance(items, list) or not all(isinstance(k, str) for k in items):
        raise UserError('keys: expected a JSON list of trial keys, e.g. ["0a1b", "2c3d"]')
    _cap("keys", len(items))
    return items


def _cap(name: str, n: int) -> None:
    if n > MAX_PICKED:
        raise UserError(f"{name}: {n:,} trials named, more than the {MAX_PICKED:,} one request takes")


def picked(table: Any, ids: list[int] | None = None, keys: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of ``table`` whose trial id is in ``ids`` or whose key is in ``keys``, in
    the table's order (trials not in the view are left out). At most :data:`MAX_PICKED`
    named in all."""
    want_ids, want_keys = set(ids or ()), set(keys or ())
    _cap("ids" if not want_keys else "keys" if not want_ids else "ids and keys", len(want_ids) + len(want_keys))
    ids, keys = table.columns["trial_id"], table.columns["key"]
    return [table.row(i) for i in range(len(ids)) if ids[i] in want_ids or keys[i] in want_keys]
