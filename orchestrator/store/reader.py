"""The one way to read the result database.

Sweeps, trials, eval points, sequential looks and early stops come out of here as rows or
pandas frames for every reader: the Python API's ``load`` and ``orchestrator export``
(:func:`sweep_frames`: SQL column names, every trial and point), the analysis
(:func:`analysis_rows`: trials of some statuses, their accuracy traces, the design's
bookkeeping), the dashboard (the ``trial_final``/``trial_trace`` views a user's SQL reads
too, and what its trace cursor asks for), ``orchestrator status`` and ``ls``. A sweep name
that is not in the database is :class:`UnknownSweep` whoever asks (the dashboard answers
404). Nothing here writes; a read on a user's behalf goes through the backend's read-only
engine (:func:`open_reader_engine`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from orchestrator.errors import UserError
from orchestrator.evals import TRACE
from orchestrator.params import flatten_params
from orchestrator.status import Status
from orchestrator.store import dialect
from orchestrator.store.lease import stale_condition
from orchestrator.store.models import (
    ATTEMPT_ENV,
    Attempt,
    Eval,
    SequentialLook,
    SweepRow,
    SystemMetric,
    Trial,
    TrialError,
    TrialStop,
)

if TYPE_CHECKING:  # pandas is imported by the functions that build frames: `status`, `ui` start light
    import pandas as pd


class NotFound(UserError):
    """An unknown sweep or trial: the dashboard answers 404."""


class UnknownSweep(NotFound):
    def __init__(self, name: str, known: Sequence[str]):
        super().__init__(f"no sweep named {name!r} in this database (sweeps: {', '.join(known[:20]) or 'none'})")


# ---- engines, clocks, sweep names -----------------------------------------------------------


def open_engine(db: str | Engine | None) -> Engine:
    """An engine on an existing database: an Engine passes through, a URL or path is opened
    without creating a schema (a missing database is a UserError, not an empty one)."""
    if isinstance(db, Engine):
        return db
    from orchestrator.store.engine import open_store_engine

    return open_store_engine(db, auto_create=False)[0]


def open_reader_engine(db: str | None, *, pool_size: int = dialect.READER_POOL) -> tuple[Engine, str]:
    """An engine on ``db`` that refuses writes and reads with a reader's rights (the
    backend's :meth:`~orchestrator.store.dialect.Dialect.reader_engine`, ``pool_size``
    connections), and its URL; a missing SQLite file or a privileged PostgreSQL URL without a
    reader role is a UserError."""
    from orchestrator.store.engine import ensure_schema, resolve_url

    url = resolve_url(db)
    engine = dialect.for_url(url).reader_engine(url, pool_size=pool_size)
    try:
        ensure_schema(engine, url, auto_create=False)
    except sa.exc.DBAPIError as exc:
        raise UserError(f"cannot open database {dialect.describe(url)}: {exc.orig}") from None
    return engine, url


@overload
def aware(t: None) -> None: ...
@overload
def aware(t: dt.datetime | str) -> dt.datetime: ...
def aware(t: Any) -> dt.datetime | None:
    """A stored time as an aware datetime (UTC when it carries no zone; SQLite hands back
    ``CURRENT_TIMESTAMP`` values as naive text)."""
    if t is None:
        return None
    if isinstance(t, str):
        t = dt.datetime.fromisoformat(t)
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def db_now(conn: Connection) -> dt.datetime:
    """The database clock (what every stored time was written with)."""
    return aware(conn.execute(sa.text("SELECT CURRENT_TIMESTAMP")).scalar_one())


def sweep_names(conn: Connection) -> list[str]:
    return [r[0] for r in conn.execute(sa.select(SweepRow.name).order_by(SweepRow.name))]


def find_sweep(conn: Connection, name: str) -> tuple[int, str] | None:
    """(id, stored spec text) of the sweep called ``name``, or None."""
    row = conn.execute(sa.select(SweepRow.id, SweepRow.spec_text).where(SweepRow.name == name)).first()
    return (row.id, row.spec_text) if row is not None else None


# Who made a sweep (``sweeps.origin``): the runner (``submit``) or ``orchestrator import``.
ORIGIN_RUNNER = "runner"
ORIGIN_IMPORT = "import"


def sweep_origin(conn: Connection, name: str) -> str | None:
    """Who made the sweep called ``name`` (:data:`ORIGIN_RUNNER` or :data:`ORIGIN_IMPORT`),
    or None when there is no such sweep."""
    return conn.execute(sa.select(SweepRow.origin).where(SweepRow.name == name)).scalar()


def sweep_id(conn: Connection, name: str) -> int:
    """The id of the sweep called ``name``; :class:`UnknownSweep` when there is none."""
    found = find_sweep(conn, name)
    if found is None:
        raise UnknownSweep(name, sweep_names(conn))
    return int(found[0])


def spec_text(conn: Connection, name: str) -> str | None:
    """The spec text stored with the sweep (None when there is no such sweep)."""
    return conn.execute(sa.select(SweepRow.spec_text).where(SweepRow.name == name)).scalar()


def sweeps_by_creation(conn: Connection, name: str | None = None) -> list[tuple[int, str]]:
    """(id, name) of every sweep, oldest first, or of the one called ``name`` (none when absent)."""
    q = sa.select(SweepRow.id, SweepRow.name).order_by(SweepRow.created_at)
    if name is not None:
        q = q.where(SweepRow.name == name)
    return [(int(i), str(n)) for i, n in conn.execute(q).all()]


def progress_rows(conn: Connection, sid: int) -> Sequence[Any]:
    """Per trial of the sweep: key, status, params, started_at, finished_at, error, steps,
    last_step (its last eval's step) and stale (running without a live heartbeat)."""
    last = sa.select(sa.func.max(Eval.step)).where(Eval.trial_id == Trial.id).correlate(Trial).scalar_subquery()
    return conn.execute(
        sa.select(
            Trial.key,
            Trial.status,
            Trial.params,
            Trial.started_at,
            Trial.finished_at,
            Trial.error,
            Trial.steps,
            last.label("last_step"),
            stale_condition(conn).label("stale"),
        ).where(Trial.sweep_id == sid)
    ).all()


def status_counts(conn: Connection, name: str) -> dict[str, int]:
    """Trials of the sweep per stored status (statuses with none left out)."""
    rows = conn.execute(
        sa.select(Trial.status, sa.func.count())
        .join(SweepRow, SweepRow.id == Trial.sweep_id)
        .where(SweepRow.name == name)
        .group_by(Trial.status)
    ).all()
    return {str(s): int(n) for s, n in rows}


def _literal_sql(conn: Connection, stmt: Any) -> str:
    """``stmt`` with its bound values written in. Its only bound values are ids, names and
    the validated status names, so rendering them literally is safe."""
    return str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))


def _fetch_raw(conn: Connection, stmt: Any) -> list[tuple]:
    """Rows of ``stmt`` through the DBAPI cursor: SQLAlchemy's Row objects cost seconds at
    half a million eval rows."""
    cur = conn.connection.cursor()
    try:
        cur.execute(_literal_sql(conn, stmt))
        return list(cur.fetchall())
    finally:
        cur.close()


def _fetch_chunks(conn: Connection, stmt: Any, size: int) -> Iterator[list[tuple]]:
    """Rows of ``stmt`` through the DBAPI cursor, ``size`` at a time: a caller that packs
    each chunk into arrays never holds millions of Python tuples at once."""
    cur = conn.connection.cursor()
    try:
        cur.execute(_literal_sql(conn, stmt))
        while True:
            chunk = cur.fetchmany(size)
            if not chunk:
                return
            yield list(chunk)
    finally:
        cur.close()


def _eval_points(sid: int, statuses: Sequence[str] | None) -> Any:
    """(trial_id, step, acc, loss, nonfinite flag) of the sweep's evals (of trials with one
    of ``statuses``; every trial's when None)."""
    stmt = (
        sa.select(Eval.trial_id, Eval.step, Eval.acc, Eval.loss, Eval.nonfinite.is_not(None).label("nonfinite"))
        .join(Trial, Trial.id == Eval.trial_id)
        .where(Trial.sweep_id == sid)
    )
    return stmt if statuses is None else stmt.where(Trial.status.in_([str(s) for s in statuses]))


def eval_points(conn: Connection, sid: int, statuses: Sequence[str] | None) -> list[tuple]:
    """The sweep's eval points (:func:`_eval_points`) by trial and step, whole."""
    return _fetch_raw(conn, _eval_points(sid, statuses).order_by(Eval.trial_id, Eval.step))


def _eval_range(sid: int, trial_ids: tuple[int, int | None] | None) -> Any:
    """Every eval point of the sweep (all statuses), of the trials with ``lo <= id < hi``
    when ``trial_ids`` is given (no upper bound when ``hi`` is None)."""
    stmt = _eval_points(sid, None)
    if trial_ids is not None:
        lo, hi = trial_ids
        stmt = stmt.where(Eval.trial_id >= lo)
        if hi is not None:
            stmt = stmt.where(Eval.trial_id < hi)
    return stmt


def eval_point_chunks(
    conn: Connection, sid: int, size: int, trial_ids: tuple[int, int | None] | None = None
) -> Iterator[list[tuple]]:
    """Every eval point of the sweep (all statuses), ``size`` rows a chunk, in no order: an
    ORDER BY over millions of rows costs the database a sort the caller does faster on
    arrays (:func:`orchestrator.analysis.data.read_evals`). ``trial_ids``: only the trials
    with ``lo <= id < hi`` (no upper bound when ``hi`` is None): a range of the evals' key,
    so parts can be read side by side."""
    return _fetch_chunks(conn, _eval_range(sid, trial_ids), size)


def eval_point_arrays(
    conn: Connection, sid: int, dtypes: Mapping[str, Any], trial_ids: tuple[int, int | None] | None = None
) -> dict[str, Any] | None:
    """:func:`eval_point_chunks`' rows (in no order) as one array a column (``dtypes``: the
    columns trial_id, step, acc, loss, nonfinite and their numpy dtypes), read through the
    backend's columnar driver (:meth:`~orchestrator.store.dialect.Dialect.fetch_arrays`) on
    ``conn``'s database with a reader's rights; None where the backend has none. A separate
    connection reads them: the caller runs it where a kill is its deadline."""
    stmt = _eval_range(sid, trial_ids)
    url = conn.engine.url.render_as_string(hide_password=False)
    return dialect.for_url(url).fetch_arrays(url, _literal_sql(conn, stmt), dtypes)


def trial_id_bounds(conn: Connection, sid: int, parts: int) -> list[tuple[int, int | None]]:
    """The sweep's trial ids cut into at most ``parts`` consecutive ranges ``[lo, hi)`` of
    about equal numbers of trials, in order; the last has no upper bound (None), so a trial
    added since is read too. Empty for a sweep without trials."""
    n = conn.execute(sa.select(sa.func.count()).where(Trial.sweep_id == sid)).scalar_one()
    if not n:
        return []
    parts = max(1, min(parts, n))
    ids = sa.select(Trial.id).where(Trial.sweep_id == sid).order_by(Trial.id)
    cuts = [conn.execute(ids.offset(n * i // parts).limit(1)).scalar_one() for i in range(parts)]
    return list(zip(cuts, [*cuts[1:], None]))


def stops(conn: Connection, sid: int) -> dict[int, int]:
    """trial id -> the step the spec's stop rule ended it at."""
    return dict(
        conn.execute(
            sa.select(TrialStop.trial_id, TrialStop.step)
            .join(Trial, Trial.id == TrialStop.trial_id)
            .where(Trial.sweep_id == sid)
        ).all()
    )


def stopped_savings(conn: Connection, sid: int) -> tuple[int, int]:
    """(trials the stop rule ended, training steps that saved)."""
    n, steps = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(TrialStop.budget - TrialStop.step), 0))
        .join(Trial, Trial.id == TrialStop.trial_id)
        .where(Trial.sweep_id == sid)
    ).one()
    return int(n), int(steps)


# ---- one sweep as plain tables: the Python API's load and `orchestrator export` -------------

# trials columns shown besides the parameters (arm, task, seed, lr, batch_size, steps and
# eval_every are parameters too, so they come from ``params`` under the same names).
TRIAL_COLUMNS = (
    "trial_id",
    "key",
    "status",
    "attempts",
    "host",
    "node_id",
    "device",
    "final_step",
    "final_acc",
    "final_loss",
    "best_acc",
    "error",
    "created_at",
    "started_at",
    "finished_at",
)
# Where a trial ran, under names of their own: ``device`` is also a parameter (``auto``,
# ``cpu``, ``cuda``: what was asked), beside which ``placement_device`` is what it got.
PLACEMENT = {"host": "placement_host", "node_id": "placement_node_id", "device": "placement_device"}
# The trials frame's own columns, before one column per parameter.
TRIAL_FRAME_COLUMNS = tuple(PLACEMENT.get(c, c) for c in TRIAL_COLUMNS)
EVAL_COLUMNS = TRACE  # the eval point's key and numbers (orchestrator/evals.py)


# Value types a stored parameter dict holds as they are: one with only these needs no
# flattening and no JSON cells (checked by exact type, in C: 100,000 trials' params).
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _flat_cells(p: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: json_cell(v) for k, v in flatten_params(p or {}).items()}


def json_cell(v: Any) -> Any:
    """Lists and dicts as their JSON text: one scalar per cell, readable by any tool and
    groupable."""
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v


def param_columns(
    params: Sequence[Mapping[str, Any] | None], index: pd.Index, skip: Collection[str] = ()
) -> tuple[pd.DataFrame, list[str]]:
    """One column per flattened parameter (full dotted name, first-seen order, those in
    ``skip`` left out) over ``index``, and the names."""
    import pandas as pd

    flat = [p if p is not None and _SCALARS.issuperset(map(type, p.values())) else _flat_cells(p) for p in params]
    # Each distinct key order once: a sweep's trials share a few.
    orders = list(dict.fromkeys(map(tuple, flat)))
    names = list(dict.fromkeys(k for keys in orders for k in keys if k not in skip))
    # The parameters every trial has are read off the dicts by pandas' constructor (a third
    # of the time of a Python list per column at 100,000 trials); it would fill a missing
    # one with NaN where the analysis reads None, so those are listed here.
    if not names:
        return pd.DataFrame({}, index=index), names
    everywhere = set.intersection(*map(set, orders))
    frame = pd.DataFrame(flat, columns=names, index=index)
    for n in names:
        if n not in everywhere:
            frame[n] = pd.Series([f.get(n) for f in flat], index=index, dtype=object)
    return frame.infer_objects(), names


@dataclass
class SweepFrames:
    """``trials`` (one row per trial), ``evals`` (one row per eval point) and the stored
    spec text. Unpacks as ``trials, evals = frames``."""

    sweep: str
    trials: pd.DataFrame
    evals: pd.DataFrame
    spec_text: str
    params: list[str]

    def __iter__(self):
        return iter((self.trials, self.evals))


def sweep_frames(engine: Engine, sweep: str) -> SweepFrames:
    """Every trial (any status) and every eval point of ``sweep``. Column names are the SQL
    ones (``key``, ``step_lr``, ...), except where the trial ran: ``placement_host``,
    ``placement_node_id``, ``placement_device`` (:data:`PLACEMENT`); every parameter is one
    column under its full dotted name (no short or formula aliases: those are the
    analysis's conveniences), ``device`` included (an imported parameter named like one of
    the columns above is ``params.<name>``); ``metrics`` is expanded into one
    ``metrics.<name>`` column per metric."""
    import pandas as pd

    t = Trial.__table__
    with engine.connect() as conn:
        found = find_sweep(conn, sweep)
        if found is None:
            raise UnknownSweep(sweep, sweep_names(conn))
        sid, text = found
        cols = [t.c.id.label("trial_id")] + [t.c[c] for c in TRIAL_COLUMNS[1:]] + [t.c.params]
        trows = conn.execute(sa.select(*cols).where(t.c.sweep_id == sid).order_by(t.c.id)).mappings().all()
        erows = conn.execute(
            sa.select(*(Eval.__table__.c[c] for c in EVAL_COLUMNS), Eval.metrics)
            .join(Trial, Trial.id == Eval.trial_id)
            .where(Trial.sweep_id == sid)
            .order_by(Eval.trial_id, Eval.step)
        ).all()
    trials = pd.DataFrame({PLACEMENT.get(c, c): [r[c] for r in trows] for c in TRIAL_COLUMNS})
    pcols, params = param_columns([r["params"] for r in trows], trials.index)
    # No parameter of a spec is named like these columns; an imported trace's may be: it
    # is kept too, as ``params.<name>``.
    clash = {n: f"params.{n}" for n in params if n in TRIAL_FRAME_COLUMNS}
    pcols, params = pcols.rename(columns=clash), [clash.get(n, n) for n in params]
    trials = pd.concat([trials, pcols], axis=1)
    k = len(EVAL_COLUMNS)  # the metrics follow the trace's columns
    evals = pd.DataFrame([tuple(r[:k]) for r in erows], columns=list(EVAL_COLUMNS))
    evals = evals.astype({"trial_id": "int64", "step": "int64", **{c: float for c in EVAL_COLUMNS[2:]}})
    metrics = [r[k] if isinstance(r[k], dict) else (json.loads(r[k]) if r[k] else {}) for r in erows]
    names = list(dict.fromkeys(k for m in metrics for k in m))
    if names:
        evals = pd.concat(
            [
                evals,
                pd.DataFrame(
                    {f"metrics.{n}": [json_cell(m.get(n)) for m in metrics] for n in names}, index=evals.index
                ).infer_objects(),
            ],
            axis=1,
        )
    return SweepFrames(sweep=sweep, trials=trials, evals=evals, spec_text=text, params=params)


# ---- what the analysis reads ----------------------------------------------------------------


@dataclass
class AnalysisRows:
    """One sweep's trials of some statuses and their eval points, as the analysis reads
    them, with the design's bookkeeping."""

    trials: list[tuple[int, str, str, Any]]  # (id, key, status, params) in id order
    evals: list[tuple]  # (trial_id, step, acc, loss, nonfinite flag) by trial and step
    looks: list[dict] = field(default_factory=list)  # the stored sequential looks' records, in order
    stops: dict[int, int] = field(default_factory=dict)  # trial id -> the step the stop rule ended it at
    skipped: int = 0  # trials the sequential design never ran
    saved_steps: int = 0  # skipped trials' budgets plus what the stop rule cut
    budget_steps: int = 0  # every trial's full budget (superseded ones are no longer in the design)
    running: int = 0  # trials still running (any status filter), and of those the stale ones
    stale: int = 0
    failed: int = 0  # trials that failed (any status filter)
    # trial id -> its newest attempt's PROVENANCE_COLUMNS values (trials that never ran left out)
    provenance: dict[int, tuple[Any, ...]] = field(default_factory=dict)


def analysis_rows(
    engine: Engine,
    sweep: str,
    statuses: Sequence[str],
    *,
    with_evals: bool = True,
    known_params: Mapping[int, Mapping[str, Any]] | None = None,
) -> AnalysisRows:
    """The trials of ``sweep`` with one of ``statuses`` (validated by the caller) and their
    eval points, read in one pass over the sweep's evals (cheaper than an IN list of
    thousands of ids; a ``where`` filter is the caller's, on the frame). ``with_evals``
    False: no eval points (the caller has them already). ``known_params``: trial id -> its
    params decoded already, nested or flattened (:func:`param_columns` makes the same
    columns of both; a trial's params never change once stored), by a caller that read this
    sweep's trials just before (the dashboard's table); the others are decoded here."""
    known = known_params or {}
    statuses = [str(s) for s in statuses]

    with engine.connect() as conn:
        sid = sweep_id(conn, sweep)
        # Through the DBAPI cursor, the params decoded here: at 100,000 trials SQLAlchemy's
        # Row objects and its JSON type's processing cost 0.4 s more (1.2-1.5 s of CPU for
        # this read, now 0.9). The driver of a JSON column may hand it back decoded already.
        rows = [
            (i, k, st, known[i] if i in known else json.loads(p) if isinstance(p, (str, bytes)) else p)
            for i, k, st, p in _fetch_raw(
                conn,
                sa.select(Trial.id, Trial.key, Trial.status, sa.type_coerce(Trial.params, sa.Text))
                .where(Trial.sweep_id == sid, Trial.status.in_(statuses))
                .order_by(Trial.id),
            )
        ]
        eval_rows = eval_points(conn, sid, statuses) if with_evals else []
        looks = [
            dict(r.record)
            for r in conn.execute(
                sa.select(SequentialLook.record).where(SequentialLook.sweep_id == sid).order_by(SequentialLook.id)
            )
        ]
        # Trials and their budgets by status, in one pass (six counts took six).
        by_status = {
            str(st): (int(n), int(total or 0))
            for st, n, total in conn.execute(
                sa.select(Trial.status, sa.func.count(Trial.id), sa.func.coalesce(sa.func.sum(Trial.steps), 0))
                .where(Trial.sweep_id == sid)
                .group_by(Trial.status)
            )
        }
        skipped, skipped_steps = by_status.get(Status.skipped.value, (0, 0))
        _, stop_steps = stopped_savings(conn, sid)
        running = by_status.get(Status.running.value, (0, 0))[0]
        stale = int(
            conn.execute(
                sa.select(sa.func.count(Trial.id)).where(Trial.sweep_id == sid, stale_condition(conn))
            ).scalar_one()
        )
        failed = by_status.get(Status.failed.value, (0, 0))[0]
        budget_steps = sum(total for st, (_n, total) in by_status.items() if st != Status.superseded.value)
        stopped = stops(conn, sid)
        provenance = latest_provenance(conn, sid)
    return AnalysisRows(
        trials=rows,
        evals=eval_rows,
        looks=looks,
        stops=stopped,
        skipped=int(skipped),
        saved_steps=int(skipped_steps) + int(stop_steps),
        budget_steps=int(budget_steps),
        running=int(running),
        stale=int(stale),
        failed=int(failed),
        provenance=provenance,
    )


def eval_metrics(engine: Engine, trial_ids: Sequence[int]) -> Iterator[tuple[int, int, Any]]:
    """(trial id, step, metrics) of every eval point of the given trials."""
    ids = [int(i) for i in trial_ids]
    with engine.connect() as conn:
        for lo in range(0, len(ids), 500):
            chunk = ids[lo : lo + 500]
            yield from conn.execute(sa.select(Eval.trial_id, Eval.step, Eval.metrics).where(Eval.trial_id.in_(chunk)))


# ---- what the dashboard and the terminal views read -----------------------------------------


def sweep_index(conn: Connection) -> Sequence[Any]:
    """Every sweep (creation order): name, spec_text, created_at, started (its first trial's
    start) and updated (its trials' last write)."""
    return conn.execute(
        sa.text(
            "SELECT s.name, s.spec_text, s.created_at, MIN(t.started_at) AS started, "
            "MAX(t.updated_at) AS updated FROM sweeps s LEFT JOIN trials t ON t.sweep_id = s.id "
            "GROUP BY s.id, s.name, s.spec_text, s.created_at ORDER BY s.created_at"
        )
    ).all()


def sweep_list(engine: Engine) -> list[dict[str, Any]]:
    """Each sweep's trial counts (``orchestrator ls``): completed, and stale (running with no
    live heartbeat)."""
    with engine.connect() as conn:
        q = (
            sa.select(
                SweepRow.name,
                SweepRow.created_at,
                sa.func.count(Trial.id).label("trials"),
                sa.func.sum(sa.case((Trial.status == Status.completed.value, 1), else_=0)).label("completed"),
                sa.func.sum(sa.case((stale_condition(conn), 1), else_=0)).label("stale"),
            )
            .select_from(SweepRow)
            .outerjoin(Trial, Trial.sweep_id == SweepRow.id)
            .group_by(SweepRow.id, SweepRow.name, SweepRow.created_at)
            .order_by(SweepRow.created_at)
        )
        return [dict(r._mapping) for r in conn.execute(q)]


# The trial table's columns besides the final figures (:func:`table_rows`, :func:`trial_rows`).
_TRIAL_COLUMNS = "t.key, t.status, t.steps, t.params, t.error, t.host, t.device, t.started_at, t.updated_at"


def table_rows(conn: Connection, sid: int) -> list[tuple]:
    """Per trial of the sweep (by id): trial_id, key, status, steps, params, error, host,
    device, started_at, updated_at, and the ``trial_final`` view's final_step, final_acc,
    final_loss, best_acc. Through the DBAPI cursor (100,000 trials)."""
    return _fetch_raw(
        conn,
        sa.text(
            f"SELECT t.id, {_TRIAL_COLUMNS}, f.final_step, f.final_acc, f.final_loss, f.best_acc "
            f"FROM trials t JOIN trial_final f ON f.trial_id = t.id WHERE t.sweep_id = {int(sid)} ORDER BY t.id"
        ),
    )


def trial_rows(conn: Connection, sid: int) -> list[tuple]:
    """:func:`table_rows` without the final figures (the caller has the eval rows): one
    pass over the trials, where the view's figures cost a search of every trial's evals."""
    return _fetch_raw(
        conn, sa.text(f"SELECT t.id, {_TRIAL_COLUMNS} FROM trials t WHERE t.sweep_id = {int(sid)} ORDER BY t.id")
    )


def trial_row(conn: Connection, sid: int, key: str) -> Any | None:
    """Every stored column of one trial of the sweep (None when it has no such key)."""
    return conn.execute(
        sa.text(
            "SELECT id, key, status, attempts, params, host, node_id, device, steps, error, "
            "final_step, final_acc, best_acc, created_at, started_at, finished_at, updated_at "
            "FROM trials WHERE sweep_id = :s AND key = :k"
        ),
        {"s": sid, "k": key},
    ).first()


def live_rows(conn: Connection, name: str) -> Sequence[Any]:
    """Per trial (by id): key, status, steps, final_step, final_acc, params, started_at."""
    return conn.execute(
        sa.text(
            "SELECT f.key, f.status, f.steps, f.final_step, f.final_acc, f.params, t.started_at "
            "FROM trial_final f JOIN trials t ON t.id = f.trial_id WHERE f.sweep = :n "
            "ORDER BY f.trial_id"
        ),
        {"n": name},
    ).all()


def touched_trials(conn: Connection, name: str, since: dt.datetime) -> set[int]:
    """Ids of the sweep's trials written at or after ``since`` (database clock) or still running."""
    rows = conn.execute(
        sa.text(
            "SELECT t.id FROM trials t JOIN sweeps s ON s.id = t.sweep_id WHERE s.name = :n "
            "AND (t.updated_at >= :th OR t.status = :running)"
        ),
        {"n": name, "th": dialect.for_connection(conn).time_param(since), "running": Status.running.value},
    ).scalars()
    return {int(i) for i in rows}


def trace_rows(conn: Connection, name: str, columns: Sequence[str], trial_ids: Collection[int] | None) -> list[tuple]:
    """The sweep's ``trial_trace`` rows (``columns``, names of that view), by trial and step;
    only those of ``trial_ids`` unless it is None."""
    sql = f"SELECT {', '.join(columns)} FROM trial_trace WHERE sweep = :n"
    if trial_ids is not None:
        if not trial_ids:
            sql += " AND 1 = 0"
        else:
            sql += f" AND trial_id IN ({', '.join(str(int(i)) for i in sorted(trial_ids))})"
    sql += " ORDER BY trial_id, step"
    return _fetch_raw(conn, sa.text(sql).bindparams(n=name))


def write_stamp(engine: Engine, name: str) -> tuple:
    """What changes whenever the sweep's trials or evals are written: the trial count per
    status and the latest ``updated_at`` (every eval flush touches it)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT t.status, COUNT(*), MAX(t.updated_at) FROM trials t JOIN sweeps s "
                "ON s.id = t.sweep_id WHERE s.name = :n GROUP BY t.status ORDER BY t.status"
            ),
            {"n": name},
        ).all()
    return tuple((r[0], int(r[1]), str(r[2])) for r in rows)


# ---- attempts (migration 0007): where, with which code, from which step ---------------------


@dataclass(frozen=True)
class Environment:
    """One code and torch version that ran attempts of a sweep."""

    code_version: str | None
    code_hash: str | None
    torch_version: str | None
    trials: int
    attempts: int


def environments(conn: Connection, sid: int) -> list[Environment]:
    """Every (code, torch) that ran attempts of the sweep, the most trials first."""
    rows = conn.execute(
        sa.select(
            Attempt.code_version,
            Attempt.code_hash,
            Attempt.torch_version,
            sa.func.count(sa.distinct(Attempt.trial_id)),
            sa.func.count(Attempt.id),
        )
        .join(Trial, Trial.id == Attempt.trial_id)
        .where(Trial.sweep_id == sid)
        .group_by(Attempt.code_version, Attempt.code_hash, Attempt.torch_version)
    ).all()
    out = [Environment(r[0], r[1], r[2], int(r[3]), int(r[4])) for r in rows]
    return sorted(out, key=lambda e: (-e.trials, str(e.code_version)))


# What each trial's newest attempt adds to the analysis frame (``--where``/``--by`` names).
PROVENANCE_COLUMNS = ("code_version", "host", "device")


def latest_provenance(conn: Connection, sid: int) -> dict[int, tuple[Any, ...]]:
    """trial id -> (code_version, host, device) of its newest attempt."""
    newest = (
        sa.select(Attempt.trial_id, sa.func.max(Attempt.attempt).label("n"))
        .join(Trial, Trial.id == Attempt.trial_id)
        .where(Trial.sweep_id == sid)
        .group_by(Attempt.trial_id)
        .subquery()
    )
    rows = conn.execute(
        sa.select(Attempt.trial_id, Attempt.code_version, Attempt.host, Attempt.device).join(
            newest, sa.and_(newest.c.trial_id == Attempt.trial_id, newest.c.n == Attempt.attempt)
        )
    ).all()
    return {int(r[0]): tuple(r[1:]) for r in rows}


ATTEMPT_COLUMNS = (
    "attempt",
    "from_step",
    "outcome",
    "error_kind",
    "started_at",
    "ended_at",
    "driver",
    # code_hash is the code-change guard's fingerprint (runner/provenance.py); code_version
    # is what names the code to a reader.
    *(c for c in ATTEMPT_ENV if c != "code_hash"),
)


def trial_attempts(conn: Connection, trial_id: int) -> list[dict[str, Any]]:
    """Every attempt of one trial, oldest first (the ``trial_attempts`` view's columns)."""
    names = (*ATTEMPT_COLUMNS, "slurm_job")  # the view predates migration 0012's column
    cols = [getattr(Attempt, c) for c in names]
    rows = conn.execute(sa.select(*cols).where(Attempt.trial_id == trial_id).order_by(Attempt.attempt)).all()
    return [dict(zip(names, r)) for r in rows]


@dataclass
class AttemptStory:
    """What one attempt of a trial left to read: its console tail (``attempts.log``) and
    the errors recorded against it (``trial_errors``: one line and the traceback)."""

    attempt: int | None
    outcome: str | None
    from_step: int | None
    started_at: Any
    ended_at: Any
    log: str | None
    errors: list[dict[str, Any]] = field(default_factory=list)


def attempt_stories(conn: Connection, trial_id: int) -> list[AttemptStory]:
    """Every attempt of one trial with its log and errors, oldest first; errors of a trial
    that ran before attempts were recorded come as one story with ``attempt`` None."""
    stories = {
        r.attempt: AttemptStory(r.attempt, r.outcome, r.from_step, r.started_at, r.ended_at, r.log)
        for r in conn.execute(
            sa.select(
                Attempt.attempt, Attempt.outcome, Attempt.from_step, Attempt.started_at, Attempt.ended_at, Attempt.log
            )
            .where(Attempt.trial_id == trial_id)
            .order_by(Attempt.attempt)
        )
    }
    for e in conn.execute(
        sa.select(TrialError.attempt, TrialError.kind, TrialError.error, TrialError.traceback)
        .where(TrialError.trial_id == trial_id)
        .order_by(TrialError.id)
    ):
        story = stories.get(e.attempt)
        if story is None:
            story = stories.setdefault(e.attempt, AttemptStory(e.attempt, None, None, None, None, None))
        story.errors.append({"kind": e.kind, "error": e.error, "traceback": e.traceback})
    return [stories[k] for k in sorted(stories, key=lambda a: (a is not None, a or 0))]


# What a worker's sample fills in system_metrics (runner/messages.py maps its wire form here;
# repo.upsert_system_metrics writes them).
SAMPLE_COLUMNS = ("elapsed_s", "cpu_pct", "rss_bytes", "gpu_util_pct", "gpu_mem_bytes", "steps_per_s")
# The columns of system_metrics as :func:`system_metrics` gives them (trial_id left out).
SYSTEM_COLUMNS = ("step", "attempt") + SAMPLE_COLUMNS


def system_metrics(conn: Connection, trial_id: int) -> list[dict[str, Any]]:
    """What the trial's worker sampled at each eval step (``system_metrics``), in step order."""
    cols = [getattr(SystemMetric, c) for c in SYSTEM_COLUMNS]
    rows = conn.execute(sa.select(*cols).where(SystemMetric.trial_id == trial_id).order_by(SystemMetric.step)).all()
    return [dict(zip(SYSTEM_COLUMNS, r)) for r in rows]
