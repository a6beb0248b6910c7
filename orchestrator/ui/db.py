"""What the dashboard shows, read through :mod:`orchestrator.store.reader` with an engine
that cannot write (:func:`~orchestrator.store.reader.open_reader_engine`: SQLite opened with
``mode=ro`` and the authorizer ``orchestrator sql`` uses, PostgreSQL sessions ``READ ONLY``).
Traces come from the ``trial_trace`` view, final figures from ``trial_final``, so the
dashboard reads the same stable names a user's SQL does; a sweep past
``offload.OFFLOAD_TRIALS`` trials, whose eval rows the page reads anyway for its bands, takes its
table's final figures from those rows by the view's definitions (:func:`final_figures`,
checked equal to the view's in ``tests/test_ui_table.py``).

The trace cursor: a client that has the traces sends back the ``cursor`` of its last answer
and gets only the eval rows written since. The cursor carries the database clock at that
read and, for every trial that was still being written (running, or touched within
``MARGIN_S`` of that clock), the last step sent. The next read looks only at those trials
plus any touched since (clock - margin), and sends only steps past the ones the client has.
The margin covers PostgreSQL's ``now()`` being the writer's transaction start and SQLite's
one-second clock.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import functools
import json
import re
import threading
from collections.abc import Callable
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import yaml
from sqlalchemy.engine import Engine

from orchestrator.evals import TRACE
from orchestrator.errors import UserError
from orchestrator.status import Status
from orchestrator.store import reader
from orchestrator.store.reader import NotFound, aware
from orchestrator.ui.table import ROW_COLUMNS
from orchestrator.yaml_load import load_capped

if TYPE_CHECKING:
    from orchestrator.analysis.config import AnalysisConfig
    from orchestrator.analysis.pipeline import Prepared

MARGIN_S = 120.0
TRACE_COLUMNS = ("trial_id", "step", "acc", "loss")
# Every column of the eval point (orchestrator/evals.py): the live traces' short form above.
FULL_COLUMNS = (*TRACE, "metrics")
# What the escape-time view counts: running trials too, censored at their last eval so far.
ESCAPE_STATUSES = [Status.running.value, Status.completed.value, Status.diverged.value]


def _params(p: Any) -> dict:
    return p if isinstance(p, dict) else json.loads(p or "{}")


# A stored spec is read back with the product's strict loader and its caps (an import's
# file name, or any other stored text, is never trusted to be a small spec).
SPEC_MAX_CHARS = 1024 * 1024
SPEC_MAX_NODES = 100_000
MAX_DESCRIPTION = 2000


def read_spec(spec_text: str | None) -> tuple[dict[str, Any], str | None]:
    """A stored spec as a mapping, and why it could not be read as one (None when it could:
    empty text is an empty spec)."""
    try:
        data = load_capped(spec_text or "", max_chars=SPEC_MAX_CHARS, max_nodes=SPEC_MAX_NODES)
    except yaml.YAMLError as exc:
        why = str(exc).strip().splitlines()
        return {}, (why[0] if why else type(exc).__name__)[:200]
    if data is None:
        return {}, None
    if not isinstance(data, dict):
        return {}, f"a {type(data).__name__}, not a mapping"
    return data, None


def spec_description(spec_text: str) -> str:
    """The ``description:`` of a stored spec ("" when it has none; a note when the stored
    text is not a spec this dashboard can read)."""
    return _description(*read_spec(spec_text))


def _description(data: dict[str, Any], problem: str | None) -> str:
    if problem is not None:
        return f"(stored spec unparseable: {problem})"
    d = data.get("description")
    if isinstance(d, bool) or not isinstance(d, (str, int, float)):
        return ""  # a structure is not a description (and str() of one can be huge)
    d = str(d)
    return d if len(d) <= MAX_DESCRIPTION else d[:MAX_DESCRIPTION] + "…"


def spec_analysis(conn, name: str) -> dict[str, Any]:
    data, _problem = read_spec(reader.spec_text(conn, name))
    block = data.get("analysis")
    return block if isinstance(block, dict) else {}


# The index's ETA: one RateWindow per sweep (orchestrator/eta.py, the terminal view's rule),
# fed each time the sweep list is read; the page reads it every poll interval.
_ETA_WINDOWS: dict[tuple[int, str], Any] = {}
_ETA_LOCK = threading.Lock()


def _eta(engine: Engine, st: dict[str, Any]) -> tuple[float | None, str | None]:
    """``(seconds, None)`` for a sweep being run whose recent rate gives an ETA, else
    ``(None, why not)``: done, not running, or still estimating."""
    import time

    from orchestrator.eta import RateWindow

    progress, total = st.get("progress"), (st.get("saved") or {}).get("of_steps") or 0
    key = (id(engine), st.get("sweep", ""))
    if progress is not None and progress >= 1:
        _ETA_WINDOWS.pop(key, None)
        return None, "done"
    if not (st.get("driver") or st.get("drivers")):
        _ETA_WINDOWS.pop(key, None)
        return None, "not running"
    now = time.monotonic()
    with _ETA_LOCK:
        window = _ETA_WINDOWS.setdefault(key, RateWindow())
        window.add(now, (progress or 0.0) * total)
        eta = window.eta(total, now)
    return (eta, None) if eta is not None else (None, "estimating")


def sweeps(engine: Engine) -> list[dict[str, Any]]:
    """Every sweep: counts by status, share of steps done, ETA (from the recent rate, or
    why there is none), first start, last write."""
    from orchestrator.store.progress import progress_report

    report = {s["sweep"]: s for s in progress_report(engine)["sweeps"]}
    with engine.connect() as conn:
        rows = reader.sweep_index(conn)
    out = []
    for r in rows:
        st = report.get(r.name, {})
        spec = read_spec(r.spec_text)
        eta_s, eta_note = _eta(engine, st) if st else (None, None)
        out.append(
            {
                "name": r.name,
                "description": _description(*spec),
                "spec_error": spec[1],
                "total": st.get("total", 0),
                "counts": st.get("counts", {}),
                "progress": st.get("progress"),
                "eta_s": eta_s,
                "eta_note": eta_note,
                "created_at": _iso(r.created_at),
                "started_at": _iso(r.started),
                "updated_at": _iso(r.updated),
            }
        )
    return out


# SQLite's CURRENT_TIMESTAMP text: naive, UTC.
_NAIVE_TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?")


def _iso(t: Any) -> str | None:
    """A stored time as ISO 8601 text to the second, in UTC when it carries no zone."""
    if isinstance(t, str) and _NAIVE_TIME.fullmatch(t):
        # Two per row of a 100,000-trial table: text to text, no datetime in between.
        return f"{t[:10]}T{t[11:19]}+00:00"
    t = aware(t)
    return t.isoformat(timespec="seconds") if t else None


# A table row's fields: the columns a page sorts by, and the trial's flattened params.
ROW_FIELDS = (*ROW_COLUMNS, "params")


class TrialTable:
    """One sweep's trials (after ``where``) as columns, one list per field of
    :data:`ROW_FIELDS` (``params``: each trial's flattened params), with the parameter names
    and the parameters that vary (what a user groups or facets by). A row is a dict built
    when asked for (:meth:`row`, :attr:`rows`): a 100,000-trial page shows 100 of them, and
    building them all cost 0.8 s of the server's time; its sort and its bands read columns."""

    def __init__(self, columns: dict[str, list[Any]], params: list[str], varying: list[str]) -> None:
        self.columns = columns
        self.params = params
        self.varying = varying

    @classmethod
    def of_rows(cls, rows: list[dict[str, Any]], params: list[str], varying: list[str]) -> TrialTable:
        return cls({f: [r[f] for r in rows] for f in ROW_FIELDS}, params, varying)

    def __len__(self) -> int:
        return len(self.columns["trial_id"])

    def row(self, i: int) -> dict[str, Any]:
        return {f: self.columns[f][i] for f in ROW_FIELDS}

    @functools.cached_property
    def rows(self) -> list[dict[str, Any]]:
        """Every row (built once, on first use: a whole table's answer, its CSV)."""
        return [self.row(i) for i in range(len(self))]

    @functools.cached_property
    def default_by(self) -> str | None:
        """The page's default colour (:func:`_default_by`), worked out once per table: the
        table is cached while the sweep is unchanged and shared by the bands and the page."""
        return _default_by(self.columns["params"], self.varying)


class _Coalesce:
    """Concurrent identical calls share one computation; nothing is kept once it ends, so an
    answer is never older than a call already running when the request came. Used for one
    trial's row (``trials(..., key=)``); whole tables go through :data:`TABLES`, which builds
    each once at a time too."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.flight: dict[tuple, tuple[threading.Event, list]] = {}

    def run(self, key: tuple, fn):
        with self.lock:
            f = self.flight.get(key)
            owner = f is None
            if f is None:
                f = self.flight[key] = (threading.Event(), [])
        done, box = f
        if not owner:
            done.wait()
            # The first caller failed (its deadline, a bad where): this one computes its own.
            return box[0] if box else fn()
        try:
            value = fn()
            box.append(value)
            return value
        finally:
            with self.lock:
                self.flight.pop(key, None)
            done.set()


_TRIALS = _Coalesce()


def trials(engine: Engine, name: str, where: str | None = None, key: str | None = None) -> TrialTable:
    """The sweep's trial table after ``where`` (or the one trial ``key``); callers share the
    :class:`TrialTable` of an identical call in flight, or of the same sweep state
    (:data:`TABLES`), and must not change it."""
    if key is None:
        # Whole tables are kept while the sweep is unchanged (the page, its bands and a
        # reload all ask for the same one, and 100,000 trials take seconds to read and
        # flatten), and the cache builds each once at a time.
        return TABLES.get(engine, name, _table_key(engine, name, where), lambda: _trials(engine, name, where, None))
    return _TRIALS.run((id(engine), name, where, key), lambda: _trials(engine, name, where, key))


def _table_key(engine: Engine, name: str, where: str | None) -> tuple:
    return (id(engine), name, "table", where or "")


def _trials(engine: Engine, name: str, where: str | None, key: str | None) -> TrialTable:
    from orchestrator.analysis.data import params_frame
    from orchestrator.analysis.where import filter_trial_ids
    from orchestrator.params import flatten_params
    from orchestrator.ui import offload

    # A big sweep's page reads every eval row for its bands (sweep_evals, shared): its
    # table's final figures come from those rows rather than from the trial_final view,
    # whose per-trial searches of the evals cost the database a second at 100,000 trials.
    # The same definitions (final_figures); a smaller sweep, or one trial, reads the view.
    big = key is None and sum(c for _s, c, _t in reader.write_stamp(engine, name)) > offload.OFFLOAD_TRIALS
    with engine.connect() as conn:
        sid = reader.sweep_id(conn, name)
        rows = reader.trial_rows(conn, sid) if big else reader.table_rows(conn, sid)
        stops = reader.stops(conn, sid) if where and where.strip() else {}
        made = reader.latest_provenance(conn, sid) if where and where.strip() else {}
    ids = [r[0] for r in rows]
    params = [_params(r[4]) for r in rows]
    if where and where.strip():
        frame, _names, _al = params_frame(ids, [r[1] for r in rows], [r[2] for r in rows], params)
        # The same columns the analysis filters on (analysis.data.load_sweep), so a --where reads alike.
        frame["stopped_at"] = [float(stops[t]) if t in stops else float("nan") for t in frame["trial_id"]]
        for i, col in enumerate(reader.PROVENANCE_COLUMNS):
            frame[col] = [made[t][i] if t in made else None for t in frame["trial_id"]]
        keep = set(filter_trial_ids(frame, where))
    else:
        keep = None
    names: dict[str, None] = {}  # an ordered set
    picked: list[int] = []
    flats = []
    for i, (r, p) in enumerate(zip(rows, params)):
        if keep is not None and r[0] not in keep:
            continue
        if key is not None and r[1] != key:
            continue
        flat = flatten_params(p) if dict in map(type, p.values()) else p
        for k in flat:
            names.setdefault(k, None)
        picked.append(i)
        flats.append(flat)
    sel = [rows[i] for i in picked]
    errors = [(r[5] or "").strip() for r in sel]
    varying = [n for n in names if _varies(f.get(n) for f in flats)]
    # The final figures last: a big sweep's wait for its eval rows (read by child
    # processes, sweep_evals) overlaps the work above.
    if big:
        finals = final_figures(sweep_evals(engine, name), ids)
    else:
        finals = ([r[10] for r in rows], [r[11] for r in rows], [r[12] for r in rows], [r[13] for r in rows])
    columns: dict[str, list[Any]] = {
        "trial_id": [r[0] for r in sel],
        "key": [r[1] for r in sel],
        "status": [r[2] for r in sel],
        "steps": [r[3] for r in sel],
        "step": [finals[0][i] for i in picked],
        "final_acc": [finals[1][i] for i in picked],
        "final_loss": [finals[2][i] for i in picked],
        "best_acc": [finals[3][i] for i in picked],
        "error": [e.splitlines()[-1] if e else "" for e in errors],
        "params": flats,
        "host": [r[6] for r in sel],
        "device": [r[7] for r in sel],
        "started_at": [_iso(r[8]) for r in sel],
        "updated_at": [_iso(r[9]) for r in sel],
    }
    return TrialTable(columns, params=list(names), varying=varying)


def final_figures(evals, ids: list[int]) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """Per trial of ``ids``: its final step, the accuracy and loss there, and its best
    accuracy, from ``evals`` (the sweep's eval frame, :func:`sweep_evals`, sorted by trial
    and step), by the ``trial_final`` view's definitions: the eval at the trial's largest
    step, the largest accuracy (a stored NULL, a non-finite eval's, skipped), None where
    there is none (a trial without evals)."""
    import numpy as np

    from orchestrator.events import trial_runs

    tid = evals["trial_id"].to_numpy()
    if not len(tid):
        none: list[Any] = [None] * len(ids)
        return none, list(none), list(none), list(none)
    start, last = trial_runs(tid)
    have = tid[start]
    acc = evals["acc"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        best = np.fmax.reduceat(acc, start)  # NaN only where every accuracy is missing
    want = np.asarray(ids, dtype=np.int64)
    at = np.minimum(np.searchsorted(have, want), len(have) - 1)
    found = have[at] == want

    def column(values: np.ndarray) -> list[Any]:
        out = values[at].tolist()
        ok = found.tolist()
        return [v if f and v == v else None for v, f in zip(out, ok)]  # v != v: NaN

    step = evals["step"].to_numpy()[last]
    loss = evals["loss"].to_numpy(dtype=float)[last]
    return column(step), column(acc[last]), column(loss), column(best)


def _varies(values) -> bool:
    unset = seen = object()
    for v in values:
        k = json.dumps(v, sort_keys=True, default=str) if isinstance(v, (list, dict)) else v
        if seen is unset:
            seen = k
        elif k != seen:
            return True
    return False


def trial(engine: Engine, name: str, key: str) -> dict[str, Any]:
    """One trial: every param, status, error text, placement, timestamps, and every attempt
    (``tried``: where, with which code, from which step, how it ended)."""
    with engine.connect() as conn:
        r = reader.trial_row(conn, reader.sweep_id(conn, name), key)
        if r is None:
            raise NotFound(f"sweep {name!r} has no trial {key!r}")
        tried = reader.trial_attempts(conn, r.id)
        stories = reader.attempt_stories(conn, r.id)
        system = reader.system_metrics(conn, r.id)
    from orchestrator.params import flatten_params

    d = dict(r._mapping)
    d["params"] = flatten_params(_params(d["params"]))
    for k in ("created_at", "started_at", "finished_at", "updated_at"):
        d[k] = _iso(d[k])
    for a in tried:
        a["started_at"], a["ended_at"] = _iso(a["started_at"]), _iso(a["ended_at"])
    d["tried"] = tried
    # Each attempt's console tail and tracebacks, shown as text (the template escapes them).
    d["stories"] = [{**vars(st), "started_at": _iso(st.started_at), "ended_at": _iso(st.ended_at)} for st in stories]
    d["system"] = _system_columns(system)
    return d


_MB = 1024**2


def _system_columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The trial page's system chart: one list per series against ``step``, memory in MiB;
    the GPU series only where some sample has them (a CPU trial's are all NULL)."""

    def mb(x: Any) -> float | None:
        return None if x is None else round(x / _MB, 3)

    out: dict[str, list[Any]] = {
        "step": [r["step"] for r in rows],
        "attempt": [r["attempt"] for r in rows],
        "cpu_pct": [r["cpu_pct"] for r in rows],
        "rss_mb": [mb(r["rss_bytes"]) for r in rows],
        "steps_per_s": [r["steps_per_s"] for r in rows],
    }
    if any(r["gpu_util_pct"] is not None or r["gpu_mem_bytes"] is not None for r in rows):
        out["gpu_util_pct"] = [r["gpu_util_pct"] for r in rows]
        out["gpu_mem_mb"] = [mb(r["gpu_mem_bytes"]) for r in rows]
    return out


def trial_system(engine: Engine, name: str, key: str) -> dict[str, list[Any]]:
    """The series of :func:`trial`'s ``system`` alone (the trial page polls it while the
    trial runs)."""
    with engine.connect() as conn:
        r = reader.trial_row(conn, reader.sweep_id(conn, name), key)
        if r is None:
            raise NotFound(f"sweep {name!r} has no trial {key!r}")
        return _system_columns(reader.system_metrics(conn, r.id))


def encode_cursor(t: dt.datetime, last: dict[int, int]) -> str:
    raw = json.dumps({"t": t.isoformat(), "s": {str(k): v for k, v in last.items()}}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


# What a cursor may hold. The server gives out cursors of a few bytes per open trial (about
# 200 KiB for 10,000 running trials): past ~600 of them a cursor no longer fits a request
# line (16 KiB, uvicorn's h11 refuses more), so the pages POST it. The cap keeps a crafted
# one from costing more than a moment.
MAX_CURSOR_CHARS = 4 * 1024 * 1024
MAX_ID = 2**63 - 1  # the store's integers are 64-bit at most
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
CLOCK_SLACK = dt.timedelta(days=1)


class BadCursor(UserError):
    """A ``since=`` this server did not give out: the API answers 400."""

    def __init__(self, cursor: str, why: str):
        super().__init__(f"since={cursor[:40]!r}: not a cursor this server gave out ({why}); drop it to start over")


def _int(v: Any, what: str, cursor: str, *, key: bool = False) -> int:
    # JSON object keys are strings: a trial id comes as decimal digits, a step as a number.
    if key and isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 19:
        v = int(v)
    if type(v) is not int or not 0 <= v <= MAX_ID:  # bool is an int subclass: not a step
        raise BadCursor(cursor, f"{what} is not an integer in 0..2^63-1")
    return v


def decode_cursor(cursor: str) -> tuple[dt.datetime, dict[int, int]]:
    """``(clock, {trial_id: last step})`` of a cursor from :func:`encode_cursor`; anything
    else, however crafted, is a :class:`BadCursor` (never another exception)."""
    if len(cursor) > MAX_CURSOR_CHARS:
        raise BadCursor(cursor, f"{len(cursor)} characters, more than {MAX_CURSOR_CHARS}")
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeError, RecursionError):  # binascii.Error and JSONDecodeError are ValueErrors
        raise BadCursor(cursor, "not base64 of JSON") from None
    if not isinstance(data, dict) or set(data) != {"t", "s"}:
        raise BadCursor(cursor, "not an object with keys t and s")
    t, last = data["t"], data["s"]
    if not isinstance(t, str) or len(t) > 40 or not isinstance(last, dict):
        raise BadCursor(cursor, "its t is not a time or its s not an object")
    try:
        when = aware(dt.datetime.fromisoformat(t))
    except ValueError:
        raise BadCursor(cursor, "its t is not an ISO time") from None
    if when < EARLIEST:
        raise BadCursor(cursor, "its t is before 1970")
    return when, {_int(k, "a trial id", cursor, key=True): _int(v, "a step", cursor) for k, v in last.items()}


def thin(rows: list[tuple], max_points: int) -> tuple[list[tuple], int]:
    """Every ``stride``-th eval of each trial plus its last, the smallest stride that brings
    ``rows`` (ordered by trial, step) to at most about ``max_points``; ``(rows, stride)``.
    A line of 50 evals drawn from 25 looks the same at a page's width, and the page's first
    load of a 10,000-trial sweep halves."""
    if max_points <= 0 or len(rows) <= max_points:
        return rows, 1
    stride = -(-len(rows) // max_points)
    out, pos = [], 0
    for i, r in enumerate(rows):
        last = i + 1 == len(rows) or rows[i + 1][0] != r[0]
        if pos % stride == 0 or last:
            out.append(r)
        pos = 0 if last else pos + 1
    return out, stride


def traces(
    engine: Engine,
    name: str,
    since: str | None = None,
    trial_ids: set[int] | None = None,
    full: bool = False,
    max_points: int = 0,
) -> dict[str, Any]:
    """Eval rows of a sweep as columns (``trial_id, step, acc, loss``; with ``full`` also
    ``train_loss, step_lr, elapsed_s, metrics``), only those past ``since``, plus the
    cursor for the next call. ``max_points`` (> 0) thins a first read (:func:`thin`); the
    answer's ``stride`` says by how much (1: every row)."""
    cols = FULL_COLUMNS if full else TRACE_COLUMNS
    prev_t, prev_last = decode_cursor(since) if since else (None, {})
    with engine.connect() as conn:
        reader.sweep_id(conn, name)
        now = reader.db_now(conn)
        if prev_t is not None and prev_t > now + CLOCK_SLACK:
            raise BadCursor(since or "", "its t is after the database clock")
        if prev_t is None:
            cand = None
        else:
            cand = reader.touched_trials(conn, name, prev_t - dt.timedelta(seconds=MARGIN_S)) | set(prev_last)
        if trial_ids is not None:
            cand = set(trial_ids) if cand is None else cand & set(trial_ids)
        rows = reader.trace_rows(conn, name, cols, cand)
        open_ids = reader.touched_trials(conn, name, now - dt.timedelta(seconds=MARGIN_S))
    if prev_last:
        rows = [r for r in rows if r[1] > prev_last.get(int(r[0]), -1)]
    # Rows come ordered by (trial, step): the last value a dict keeps per trial is its top step.
    last: dict[int, int] = dict(zip(map(itemgetter(0), rows), map(itemgetter(1), rows)))
    keep = {i: max(last.get(i, -1), prev_last.get(i, -1)) for i in open_ids if trial_ids is None or i in trial_ids}
    keep = {i: s for i, s in keep.items() if s >= 0 or i in last}
    rows, stride = thin(rows, max_points) if prev_t is None else (rows, 1)
    return {
        "columns": _columns(rows, cols, exact=full),
        "n": len(rows),
        "stride": stride,
        "cursor": encode_cursor(now, keep),
        "now": now.isoformat(timespec="seconds"),
    }


def _columns(rows: list[tuple], cols: tuple[str, ...], exact: bool) -> dict[str, list]:
    """Rows as JSON-ready columns. Float columns go through numpy; unless ``exact``, they
    are rounded to 5 decimals, which no plot shows and which makes the JSON of a
    500k-row sweep a third the work (the trial page asks for exact values)."""
    import numpy as np

    if not rows:
        return {c: [] for c in cols}
    out: dict[str, list] = {}
    for i, c in enumerate(cols):
        values = list(map(itemgetter(i), rows))  # much cheaper than zip(*rows) at 500k
        if c in ("trial_id", "step"):
            out[c] = values
        elif c == "metrics":
            out[c] = [json.loads(v) if isinstance(v, str) else v for v in values]
        else:
            arr = np.array(values, dtype=float)  # None becomes NaN
            if not exact:
                arr = np.round(arr, 5)
            bad = ~np.isfinite(arr)
            lst = arr.tolist()
            if bad.any():
                for j in np.flatnonzero(bad):
                    lst[j] = None
            out[c] = lst
    return out


class _PrepCache:
    """The last few prepared sweeps (trials with their escape events), each valid while the
    sweep's write stamp is unchanged: regrouping the escape-time view, or reloading the page
    of a sweep nobody writes to, then skips reading half a million eval rows again. The
    stamp is the trial count per status plus the latest ``updated_at``; every eval flush
    touches it and every finish changes a status count.

    Bounded: at most ``size`` entries, the least recently used dropped first. One build per
    key at a time: the page's first load asks for the grid, the outcomes and the importance
    at once, all from one prepared sweep, and three builders of it would triple the work and
    the memory while they ran."""

    def __init__(self, size: int = 8):
        self.size = size
        self.items: dict[tuple, tuple[tuple, Any]] = {}
        self.lock = threading.Lock()
        self.building: dict[tuple, threading.Lock] = {}

    def _hit(self, key: tuple, stamp: tuple) -> tuple[bool, Any]:
        hit = self.items.get(key)
        if hit is not None and hit[0] == stamp:
            self.items[key] = self.items.pop(key)  # most recently used last
            return True, hit[1]
        return False, None

    def peek(self, engine: Engine, name: str, key: tuple) -> Any | None:
        """The value under ``key`` if one is kept for the sweep's present state, else None
        (nothing is built)."""
        stamp = reader.write_stamp(engine, name)
        with self.lock:
            return self._hit(key, stamp)[1]

    def get(self, engine: Engine, name: str, key: tuple | Callable[[tuple], tuple], build):
        """The value under ``key`` (or ``key(stamp)``: a key that depends on the sweep's
        state) while the stamp is unchanged, else ``build()`` kept under it."""
        stamp = reader.write_stamp(engine, name)
        if callable(key):
            key = key(stamp)
        with self.lock:
            found, value = self._hit(key, stamp)
            if found:
                return value
            gate = self.building.setdefault(key, threading.Lock())
        try:
            with gate:
                with self.lock:
                    found, value = self._hit(key, stamp)
                if found:
                    return value
                value = build()
                with self.lock:
                    self.items.pop(key, None)
                    self.items[key] = (stamp, value)
                    while len(self.items) > self.size:
                        self.items.pop(next(iter(self.items)))
                return value
        finally:
            with self.lock:
                if self.building.get(key) is gate and not gate.locked():
                    del self.building[key]


PREPARED = _PrepCache()
# Whole trial tables (:func:`trials` without a key), the two last asked for.
TABLES = _PrepCache(size=2)
# Whole eval frames (:func:`sweep_evals`), the two last asked for.
EVALS = _PrepCache(size=2)


def sweep_evals(engine: Engine, name: str):
    """Every eval point of the sweep (:func:`orchestrator.analysis.data.read_evals`), read
    once per sweep state: the grid and the escape-time curves prepare the sweep with
    different statuses and the bands group the same rows, and at 100,000 trials each read
    of the 5 million rows took seconds. A sweep of more than ``offload.OFFLOAD_TRIALS``
    trials is read by child processes (:mod:`orchestrator.ui.offload`: a part of the trials
    each, side by side), so the server's other requests are not held up by the read's
    Python work."""
    from orchestrator.analysis.data import read_evals
    from orchestrator.ui import offload

    def build():
        n = sum(c for _s, c, _t in reader.write_stamp(engine, name))
        if n > offload.OFFLOAD_TRIALS:
            with engine.connect() as conn:
                bounds = reader.trial_id_bounds(conn, reader.sweep_id(conn, name), offload.PARTS)
            try:
                return offload.read_evals(engine.url.render_as_string(hide_password=False), name, bounds)
            except offload.Unavailable:
                pass  # read here, as a smaller sweep is
        return read_evals(engine, name)

    return EVALS.get(engine, name, (id(engine), name, "evals"), build)


def escape_times(engine: Engine, name: str, by: str | None, where: str | None) -> dict[str, Any]:
    """Kaplan-Meier curves per group and the log-rank p, from the analysis layer. Running
    trials count, censored at their last eval so far."""
    from orchestrator.analysis import survival
    from orchestrator.analysis.config import parse_config
    from orchestrator.analysis.groups import check_params

    with engine.connect() as conn:
        reader.sweep_id(conn, name)
        # The spec's thresholds (escape_at, horizon, ...) hold; its groups and contrasts do
        # not, since the page picks the grouping.
        block = {
            k: v
            for k, v in spec_analysis(conn, name).items()
            if k not in ("by", "cells", "strata", "compare", "contrasts", "heatmap", "statuses", "where")
        }
    cfg = parse_config(block, source=f"sweep {name}: analysis").with_overrides(
        where=where or None, statuses=ESCAPE_STATUSES
    )
    prep = _prepared(engine, name, cfg)
    if by:
        check_params(prep.trials, [by], prep.data.params, "by")
        _few_values(prep.trials, "by", by, MAX_GROUPS, "curves the escape-time view draws")
    cfg = cfg.with_overrides(by=[by] if by else None)
    km = survival.km(prep.trials, cfg)
    out: dict[str, Any] = {"by": cfg.by, "escape_at": cfg.escape_at, "groups": km.to_dict()["groups"], "logrank": None}
    if cfg.by and len(km.groups) >= 2:
        lr = survival.logrank(prep.trials, cfg)
        out["logrank"] = {"p_value": lr.p_value, "test_statistic": lr.test_statistic, "kind": lr.details.get("kind")}
    return out


# ---- the grid view, the comparison of two sweeps, CSV ------------------------------------------
# What one view groups into at most: a parameter with more values (a seed, a learning rate
# drawn at random) is refused with one line rather than drawn as thousands of curves.
MAX_GROUPS = 50
MAX_AXIS = 200
MAX_CELLS = 10_000


def _few_values(trials, flag: str, name: str, cap: int, what: str) -> int:
    """How many values ``name`` takes in ``trials``; a UserError past ``cap``."""
    from orchestrator.analysis.groups import distinct_rows

    values = distinct_rows(trials[[name]])[name]  # each distinct value encoded once
    n = int(values.map(lambda v: json.dumps(v, sort_keys=True, default=str)).nunique())
    if n > cap:
        raise UserError(
            f"{flag}={name!r}: {n:,} values, more than the {cap} {what}; "
            "pick a parameter with fewer values, or narrow with where="
        )
    return n


GRID_DROPS = ("by", "cells", "strata", "compare", "contrasts", "heatmap", "where")
CI_METHOD = "Clopper-Pearson exact 95% (scipy.stats.binomtest)"


def _grid_prepared(engine: Engine, name: str, where: str | None):
    """The sweep prepared as ``orchestrator analyze NAME`` prepares it (the stored spec's
    thresholds and statuses, its horizon), with the page's ``where`` instead of the spec's
    groups and filter."""
    from orchestrator.analysis.config import parse_config

    with engine.connect() as conn:
        reader.sweep_id(conn, name)
        block = {k: v for k, v in spec_analysis(conn, name).items() if k not in GRID_DROPS}
    cfg = parse_config(block, source=f"sweep {name}: analysis").with_overrides(where=where or None)
    return _prepared(engine, name, cfg)


def _prepared(engine: Engine, name: str, cfg: AnalysisConfig) -> Prepared:
    """``pipeline.prepare`` of the sweep under ``cfg``, kept per sweep state (:data:`PREPARED`).
    Two configs that differ only in statuses the sweep has no trial of share one preparation:
    the grid (completed, diverged) and the escape-time curves (running too) of a finished
    sweep read and prepare the same trials, and at 100,000 trials each pass took seconds.
    The shared one is handed back with the caller's own ``cfg``."""
    from orchestrator.analysis import pipeline

    rest = cfg.model_dump_json(exclude={"statuses"})

    def key(stamp: tuple) -> tuple:
        present = {row[0] for row in stamp}
        return (id(engine), name, "prepared", rest, tuple(sorted(s for s in cfg.statuses if s in present)))

    def build() -> Prepared:
        # The page's trial table of this sweep state, when it has been built, holds every
        # trial's params decoded (0.4 s of JSON at 100,000 trials, not done twice).
        table = TABLES.peek(engine, name, _table_key(engine, name, None))
        known = dict(zip(table.columns["trial_id"], table.columns["params"])) if table is not None else None
        # The evals are asked for once the trials are read: a big sweep's read runs in child
        # processes (started by the bands beside this request) while this thread reads the trials.
        return pipeline.prepare(engine, name, cfg, evals=lambda: sweep_evals(engine, name), known_params=known)

    prep = PREPARED.get(engine, name, key, build)
    return prep if prep.cfg == cfg else dataclasses.replace(prep, cfg=cfg)


def _cell(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("n", "k", "rate", "ci_low", "ci_high", "median", "trial_ids")}


def grid(
    engine: Engine,
    name: str,
    x: str | None,
    y: str | None,
    facet: str | None = None,
    metric: str = "lockin",
    where: str | None = None,
) -> dict[str, Any]:
    """Per cell of ``x`` by ``y`` (per ``facet`` value): n, k, rate and its interval (and
    the median escape step), from :func:`orchestrator.analysis.grid.grid_cells`."""
    from orchestrator.analysis.grid import axis_values, grid_cells

    from orchestrator.analysis.groups import check_params

    if not x or not y:
        raise UserError("grid needs two axes: x=PARAM&y=PARAM")
    if x == y or facet in (x, y):
        raise UserError(f"x={x!r}, y={y!r}, facet={facet!r}: pick different parameters")
    prep = _grid_prepared(engine, name, where)
    for flag, axis in (("x", x), ("y", y), ("facet", facet)):
        check_params(prep.trials, [axis] if axis else [], prep.data.params, flag)
    nx = _few_values(prep.trials, "x", x, MAX_AXIS, "columns a grid draws")
    ny = _few_values(prep.trials, "y", y, MAX_AXIS, "rows a grid draws")
    nf = _few_values(prep.trials, "facet", facet, MAX_GROUPS, "panels a grid draws") if facet else 1
    if nx * ny * nf > MAX_CELLS:
        raise UserError(
            f"x={x!r}, y={y!r}, facet={facet!r}: {nx} x {ny} x {nf} cells, more than the {MAX_CELLS:,} "
            "a grid draws; pick parameters with fewer values, or narrow with where="
        )
    axes = ([facet] if facet else []) + [y, x]
    cells = grid_cells(prep.trials, prep.cfg, axes, metric or "lockin", prep.data.params)
    rows = cells.to_dict("records")
    facets = axis_values(cells, prep.trials, facet) if facet else [None]
    panels = []
    for fv in facets:
        mine = [r for r in rows if facet is None or r[facet] == fv]
        shown = [{"x": r[x], "y": r[y], "label": r["label"], **_cell(r)} for r in mine]
        panels.append({"value": fv, "cells": shown})
    return {
        "x": x,
        "y": y,
        "facet": facet,
        "metric": metric or "lockin",
        "x_values": axis_values(cells, prep.trials, x),
        "y_values": axis_values(cells, prep.trials, y),
        "panels": panels,
        "lockin": prep.cfg.lockin,
        "escape_at": prep.cfg.escape_at,
        "statuses": list(prep.cfg.statuses),
        "ci": CI_METHOD,
    }


def shared_params(engine: Engine, a: str, b: str) -> list[str]:
    """Parameters both sweeps have, those that vary in either first."""
    ta, tb = trials(engine, a), trials(engine, b)
    both = [p for p in ta.params if p in set(tb.params)]
    vary = set(ta.varying) | set(tb.varying)
    return [p for p in both if p in vary] + [p for p in both if p not in vary]


def _split_default(engine: Engine, a: str, b: str, by: str) -> str | None:
    """What the comparison keeps apart by default: the ``arm``, where it varies in either
    sweep and is not the compared parameter (by lr, an armed and an unarmed cell pooled
    would be one meaningless average)."""
    ta, tb = trials(engine, a), trials(engine, b)
    if by != "arm" and "arm" in ta.params and "arm" in tb.params and ("arm" in ta.varying or "arm" in tb.varying):
        return "arm"
    return None


def compare(
    engine: Engine,
    a: str,
    b: str,
    by: str | None,
    metric: str = "lockin",
    where: str | None = None,
    split: str | None = None,
) -> dict[str, Any]:
    """Two sweeps side by side along a parameter both have: per value, each sweep's n, k,
    rate and interval (and median escape step), from the same cells as :func:`grid`.
    ``split``: a parameter whose values are kept apart (one series per sweep and value;
    ``none``: pooled; unset: the arm where it varies, see :func:`_split_default`)."""
    from orchestrator.analysis.grid import grid_cells

    if not a or not b:
        raise UserError("compare needs two sweeps: a=SWEEP&b=SWEEP")
    shared = shared_params(engine, a, b)
    if not by:
        if not shared:
            raise UserError(f"sweeps {a!r} and {b!r} share no parameter to compare by")
        by = shared[0]
    if by not in shared:
        raise UserError(f"by {by!r}: not a parameter of both sweeps; shared: {', '.join(shared[:40]) or '(none)'}")
    if split == "none":
        split = None
    elif not split:
        split = _split_default(engine, a, b, by)
    elif split == by or split not in shared:
        raise UserError(f"split {split!r}: expected none or a parameter of both sweeps other than by {by!r}")
    out: dict[str, Any] = {
        "a": a,
        "b": b,
        "by": by,
        "split": split,
        "metric": metric or "lockin",
        "shared": shared,
        "ci": CI_METHOD,
        "where": where or None,
    }
    for side, name in (("a", a), ("b", b)):
        prep = _grid_prepared(engine, name, where)
        _few_values(prep.trials, "by", by, MAX_AXIS, "values a comparison lists")
        if split:
            _few_values(prep.trials, "split", split, MAX_GROUPS, "series a comparison draws")
        axes = [split, by] if split else [by]
        cells = grid_cells(prep.trials, prep.cfg, axes, metric or "lockin", prep.data.params)
        out[side + "_cells"] = [
            {"value": r[by], "split": r[split] if split else None, **_cell(r)} for r in cells.to_dict("records")
        ]
    return out


def outcomes(engine: Engine, name: str, where: str | None = None) -> dict[str, Any]:
    """One row per trial the analysis counts (the sweep's statuses, after ``where``): its
    key, the swept parameters and the three outcomes the parallel coordinates colour by
    (final accuracy, lock-in 0/1, escape step: the events' ``time``, a trial that never
    escaped at its last eval, with ``escaped`` saying which)."""
    from orchestrator.analysis.importance import swept

    prep = _grid_prepared(engine, name, where)
    t = prep.trials
    axes = swept(t, list(prep.data.params))
    # Column by column, not t.to_dict("records"): that boxes every cell of every column
    # (seconds at 100,000 trials), and a row needs seven.
    params = (
        [dict(zip(axes, vals)) for vals in zip(*(t[p].tolist() for p in axes))] if axes else [{} for _ in range(len(t))]
    )
    rows = [
        {
            "trial_id": int(tid),
            "key": key,
            "params": ps,
            "final_acc": acc,
            "lockin": int(bool(locked)),
            "escape_step": when,
            "escaped": bool(event),
        }
        for tid, key, ps, acc, locked, when, event in zip(
            t["trial_id"].tolist(),
            t["key"].tolist(),
            params,
            t["final_acc"].tolist(),
            t["locked"].tolist(),
            t["time"].tolist(),
            t["event"].tolist(),
        )
    ]
    return {
        "axes": axes,
        "rows": rows,
        "lockin": prep.cfg.lockin,
        "escape_at": prep.cfg.escape_at,
        "statuses": list(prep.cfg.statuses),
    }


def importance(engine: Engine, name: str, outcome: str = "final_acc", where: str | None = None) -> dict[str, Any]:
    """fANOVA importance of the swept parameters for ``outcome`` over the trials the
    analysis counts (:func:`orchestrator.analysis.importance.importance`, method named)."""
    from orchestrator.analysis import importance as imp

    prep = _grid_prepared(engine, name, where)
    key = (id(engine), name, "importance", outcome, prep.cfg.model_dump_json())
    res = PREPARED.get(
        engine, name, key, lambda: imp.importance(prep.trials, list(prep.data.params), outcome, prep.cfg.stopped_as)
    )
    return {**res.to_dict(), "statuses": list(prep.cfg.statuses), "lockin": prep.cfg.lockin}


def _csv_value(v: Any) -> Any:
    from orchestrator.store.export import csv_safe  # the one rule for formula-like cells

    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return ""
    if isinstance(v, (dict, list)):
        v = json.dumps(v, sort_keys=True)
    return "" if v is None else csv_safe(v)


def to_csv(columns: list[str], rows: list[dict[str, Any]]) -> str:
    """``rows`` as CSV with a header of ``columns`` (a missing value is an empty cell)."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([_csv_value(c) for c in columns])
    for r in rows:
        w.writerow([_csv_value(r.get(c)) for c in columns])
    return buf.getvalue()


def csv_view(engine: Engine, name: str, view: str, args: dict[str, str | None]) -> tuple[str, str]:
    """``(filename, CSV text)`` of the data behind one view of the sweep page: ``trials``
    (the table), ``traces`` (every eval row shown), ``km`` (the curves), ``grid`` (the cells)."""
    where = args.get("where")
    if view == "trials":
        t = trials(engine, name, where=where)
        cols = ["trial_id", "key", "status", "steps", "step", "final_acc", "final_loss", "best_acc"]
        rows = [{**{c: r[c] for c in cols}, **{"param." + p: v for p, v in r["params"].items()}} for r in t.rows]
        return f"{name}-trials.csv", to_csv(cols + ["param." + p for p in t.params], rows)
    if view == "traces":
        t = trials(engine, name, where=where)
        keys = dict(zip(t.columns["trial_id"], t.columns["key"]))
        cols = traces(engine, name, trial_ids=set(keys), full=True)["columns"]
        names = list(TRACE)
        rows = [{c: cols[c][i] for c in names} for i in range(len(cols["trial_id"]))]
        for r in rows:
            r["key"] = keys.get(r["trial_id"])
        return f"{name}-traces.csv", to_csv(["key", *names], rows)
    if view == "km":
        km = escape_times(engine, name, args.get("by"), where)
        rows = [
            {"group": g, "step": s, "not_escaped": p, "n": d["n"], "escapes": d["escapes"], "median": d["median"]}
            for g, d in km["groups"].items()
            for s, p in d["survival"]
        ]
        return f"{name}-km.csv", to_csv(["group", "step", "not_escaped", "n", "escapes", "median"], rows)
    if view == "grid":
        g = grid(engine, name, args.get("x"), args.get("y"), args.get("facet"), args.get("metric") or "lockin", where)
        lead = ([g["facet"]] if g["facet"] else []) + [g["y"], g["x"]]
        rows = [
            {**({g["facet"]: p["value"]} if g["facet"] else {}), g["y"]: c["y"], g["x"]: c["x"], **c}
            for p in g["panels"]
            for c in p["cells"]
        ]
        return f"{name}-grid.csv", to_csv([*lead, "n", "k", "rate", "ci_low", "ci_high", "median"], rows)
    if view == "outcomes":
        o = outcomes(engine, name, where)
        cols = ["trial_id", "key", *("param." + p for p in o["axes"]), "final_acc", "lockin", "escape_step", "escaped"]
        rows = [{**r, **{"param." + p: v for p, v in r["params"].items()}} for r in o["rows"]]
        return f"{name}-outcomes.csv", to_csv(cols, rows)
    if view == "importance":
        got = importance(engine, name, args.get("outcome") or "final_acc", where)
        rows = [
            {**p, "outcome": got["outcome"], "method": got["method"], "n_trials": got["n_trials"]}
            for p in got["params"]
        ]
        return f"{name}-importance.csv", to_csv(["param", "importance", "kind", "outcome", "method", "n_trials"], rows)
    raise UserError(f"view {view!r}: expected one of trials, traces, km, grid, outcomes, importance")


# ---- quantile bands: the traces view of a big sweep --------------------------------------------
# Past BAND_TRIALS trials the page draws, per colour group (and facet), the quantiles of acc
# and loss at each eval step instead of one line per trial: tens of thousands of SVG or
# software-WebGL lines take the browser many seconds, bands a few hundred points.
BAND_TRIALS = 200
BAND_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
# Steps a band keeps at most (every k-th distinct step past it, and the last): a page is
# about this many pixels wide.
BAND_MAX_STEPS = 1000


def _group_key(v: Any) -> str:
    """One string per value as the page labels it: a float that is a whole number is that
    int (JavaScript prints 1.0 as "1"), lists and dicts as sorted JSON."""
    if v is None or type(v) in (str, int, float, bool):
        return _scalar_key(type(v).__name__, v)  # a sweep's trials share a few values: each encoded once
    return _encode_key(v)


def _encode_key(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return json.dumps(v, sort_keys=True, default=str)


@functools.lru_cache(maxsize=4096)
def _scalar_key(kind: str, v: Any) -> str:
    # ``kind`` in the key: True, 1 and 1.0 are one dict key but three labels.
    return _encode_key(v)


def _default_by(params: list[dict[str, Any]], varying: list[str]) -> str | None:
    """The page's default colour: the varying parameter (not seed) with the fewest values
    (``params``: each trial's flattened params)."""
    best: tuple[int, str] | None = None
    for p in varying:
        if p == "seed":
            continue
        n = len({_group_key(f.get(p)) for f in params})
        if best is None or n < best[0]:
            best = (n, p)
    return best[1] if best else None


def band_frame(evals, group_of: dict[int, tuple[str, str]]):
    """The rows of ``evals`` (the sweep's eval frame, :func:`sweep_evals`) whose trial is in
    ``group_of``, with that trial's facet and group keys as categoricals: integer codes
    looked up by trial id, no string per row (the frame is shared and is not changed)."""
    import numpy as np
    import pandas as pd

    keys = sorted(set(group_of.values()))
    facets = sorted({f for f, _g in keys})
    groups = sorted({g for _f, g in keys})
    ids = evals["trial_id"].to_numpy()
    size = int(max(ids.max() if len(ids) else 0, max(group_of, default=0))) + 1
    fcode = np.full(size, -1, dtype=np.int64)
    gcode = np.full(size, -1, dtype=np.int64)
    f_at = {f: i for i, f in enumerate(facets)}
    g_at = {g: i for i, g in enumerate(groups)}
    for tid, (f, g) in group_of.items():
        fcode[tid], gcode[tid] = f_at[f], g_at[g]
    fc = fcode[ids]
    keep = fc >= 0
    return pd.DataFrame(
        {
            **{c: evals[c].to_numpy()[keep] for c in TRACE_COLUMNS},
            "facet": pd.Categorical.from_codes(fc[keep], categories=facets or [""]),
            "group": pd.Categorical.from_codes(gcode[ids][keep], categories=groups or [""]),
        },
        copy=False,  # fresh arrays, not copied again into 2-D blocks
    )


def band_quantiles(df) -> Any:
    """Per (facet, group, step): trials with an eval there (``n``) and the
    :data:`BAND_QUANTILES` of acc and loss (NaN-skipping), indexed by facet, group, step
    (only the combinations that have rows)."""
    g = df.groupby(["facet", "group", "step"], sort=True, observed=True)
    out = g["trial_id"].count().rename("n").to_frame()
    for col in ("acc", "loss"):
        q = g[col].quantile(list(BAND_QUANTILES)).unstack()
        q.columns = [f"{col}_q{round(p * 100)}" for p in q.columns]
        out = out.join(q)
    return out


def _json_floats(values) -> list[float | None]:
    import numpy as np

    arr = np.round(np.asarray(values, dtype=float), 5)
    return [None if not np.isfinite(x) else float(x) for x in arr]


BANDS = _PrepCache(size=16)


def bands(
    engine: Engine, name: str, by: str | None = None, facet: str | None = None, where: str | None = None
) -> dict[str, Any]:
    """The quantile bands of the sweep's traces (after ``where``) per ``facet`` value and
    ``by`` group (the page's default colour when None): per eval step the number of trials
    with an eval there and the :data:`BAND_QUANTILES` of acc and loss. Cached per sweep
    state (:class:`_PrepCache`, bounded)."""
    key = (id(engine), name, "bands", by, facet, where or "")
    return BANDS.get(engine, name, key, lambda: _bands(engine, name, by, facet, where))


def _bands(engine: Engine, name: str, by: str | None, facet: str | None, where: str | None) -> dict[str, Any]:
    # The evals first: the page asks for the table beside the bands, and a big sweep's evals
    # are read in a child process (sweep_evals) while the other request builds the table.
    evals = sweep_evals(engine, name)
    t = trials(engine, name, where=where)
    by = by or t.default_by
    for flag, p in (("by", by), ("facet", facet)):
        if p is not None and len(t) and p not in t.params:  # an empty view has no bands, not an error
            raise UserError(f"{flag}={p!r}: the sweep has no parameter of that name")
    group_of: dict[int, tuple[str, str]] = {}
    value_of: dict[str, Any] = {}
    count: dict[tuple[str, str], int] = {}
    for tid, flat in zip(t.columns["trial_id"], t.columns["params"]):
        fv = flat.get(facet) if facet else None
        gv = flat.get(by) if by else None
        fk, gk = _group_key(fv), _group_key(gv)
        value_of.setdefault(fk, fv)
        value_of.setdefault(gk, gv)
        group_of[tid] = (fk, gk)
        count[fk, gk] = count.get((fk, gk), 0) + 1
    ngroups = len({g for _f, g in count})
    if ngroups > MAX_GROUPS:
        raise UserError(
            f"by={by!r}: {ngroups:,} values, more than the {MAX_GROUPS} groups the quantile bands draw; "
            "colour by a parameter with fewer values, or narrow with where="
        )
    q = band_quantiles(band_frame(evals, group_of))
    drawn = set(q.index.droplevel("step"))
    panels: dict[str, dict[str, Any]] = {}
    for (fk, gk), n in sorted(count.items()):
        panel = panels.setdefault(fk, {"value": value_of[fk], "groups": []})
        entry: dict[str, Any] = {"value": value_of[gk], "trials": n, "step": [], "n": []}
        if (fk, gk) in drawn:
            part = q.loc[(fk, gk)]
            stride = -(-len(part) // BAND_MAX_STEPS)
            if stride > 1:
                keep = list(range(0, len(part), stride))
                if keep[-1] != len(part) - 1:
                    keep.append(len(part) - 1)
                part = part.iloc[keep]
            entry["step"] = [int(s) for s in part.index]
            entry["n"] = [int(x) for x in part["n"]]
            for c in part.columns:
                if c != "n":
                    entry[c] = _json_floats(part[c])
        panel["groups"].append(entry)
    return {
        "by": by,
        "facet": facet,
        "quantiles": list(BAND_QUANTILES),
        "n_trials": len(t),
        "panels": list(panels.values()),
        "stamp": json.dumps(reader.write_stamp(engine, name), default=str),
    }
