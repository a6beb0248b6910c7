"""Trials and eval traces of one sweep, read from the store into pandas.

``trials`` has one row per trial: ``trial_id``, ``key``, ``status`` and every
resolved parameter as a column under its full dotted name, plus two aliases per dotted
name where they do not clash: the short name (the part after the last dot) when no other
parameter shares it, and the name with non-identifier characters as underscores (what a
patsy formula can use). ``evals`` has ``trial_id, step, acc, loss, nonfinite``, sorted by
trial and step: every stored point, a diverged trial's too (``nonfinite`` is True where
the point had a non-finite value, stored as NULL: a NaN loss beside a finite accuracy);
how the analyses count those is :mod:`.diverged`. Both are read with plain SQL; nothing
here writes.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from orchestrator.errors import UserError
from orchestrator.store.lease import stale_condition
from orchestrator.store.models import Eval, SequentialLook, Sweep, Trial, TrialStop
from orchestrator.params import flatten_params

from .config import ALL_STATUSES, DEFAULT_STATUSES
from .where import filter_trial_ids

META_COLUMNS = ("trial_id", "key", "status")


@dataclass
class SweepData:
    """One sweep's trials (after ``where`` and the status filter) and their evals."""

    sweep: str
    trials: pd.DataFrame
    evals: pd.DataFrame
    params: list[str]  # full dotted parameter names, in first-seen order
    aliases: dict[str, str] = field(default_factory=dict)  # alias column -> full name
    # Designs: the stored group-sequential looks (records, in order) and the seeds skipped.
    looks: list[dict] = field(default_factory=list)
    skipped: int = 0
    # Training steps not spent: skipped trials' budgets plus what the stop rule cut.
    saved_steps: int = 0
    budget_steps: int = 0  # every trial's full budget, for the fraction
    # Trials the default status filter leaves out because they are still running, and of
    # those the stale ones (no heartbeat for longer than the lease TTL: their driver is gone).
    running: int = 0
    stale: int = 0

    def unfinished_note(self) -> str | None:
        """One line about running and stale trials not in the analysis, or None."""
        if not self.running:
            return None
        stale = (
            f", {self.stale} of them stale (no heartbeat: their driver is gone; `orchestrator resume` re-runs them)"
            if self.stale
            else ""
        )
        return f"{self.running} trial(s) still running{stale} are not in this analysis"

    def column(self, name: str) -> str:
        """The trials column for a parameter given by full name or alias."""
        return resolve_column(self.trials, name, self.params)


def resolve_column(trials: pd.DataFrame, name: str, params: Sequence[str] = ()) -> str:
    if name in trials.columns:
        return name
    known = ", ".join(list(params)[:40]) or "(none)"
    raise UserError(f"unknown parameter {name!r}; this sweep's parameters: {known}")


def _hashable(v):
    # Lists and dicts cannot be grouped on; their JSON text can.
    if isinstance(v, (list, dict)):
        return json.dumps(v, sort_keys=True)
    return v


def formula_name(name: str) -> str:
    """A parameter name as a Python identifier (dots and other symbols become ``_``)."""
    out = re.sub(r"\W", "_", name)
    return f"_{out}" if out[:1].isdigit() else out


def params_frame(
    ids: Sequence[int], keys: Sequence[str], statuses: Sequence[str], params: Sequence[dict]
) -> tuple[pd.DataFrame, list[str], dict[str, str]]:
    """Build the trials frame (see the module docstring) from raw trial rows."""
    flat = [{k: _hashable(v) for k, v in flatten_params(p or {}).items()} for p in params]
    names: list[str] = list(dict.fromkeys(k for f in flat for k in f))
    frame = pd.DataFrame({"trial_id": np.asarray(ids, dtype=np.int64), "key": list(keys), "status": list(statuses)})
    cols = {n: [f.get(n) for f in flat] for n in names if n not in META_COLUMNS}
    param_df = pd.DataFrame(cols, index=frame.index)
    param_df = param_df.infer_objects()
    frame = pd.concat([frame, param_df], axis=1)
    aliases: dict[str, str] = {}
    shorts = Counter(n.rsplit(".", 1)[-1] for n in names)
    taken = set(frame.columns)
    for n in names:
        if n in META_COLUMNS:
            continue
        cands = []
        short = n.rsplit(".", 1)[-1]
        if short != n and shorts[short] == 1:
            cands.append(short)
        cands.append(formula_name(n))
        for alias in cands:
            if alias != n and alias not in taken:
                aliases[alias] = n
                taken.add(alias)
    if aliases:
        frame = pd.concat([frame, pd.DataFrame({a: frame[n] for a, n in aliases.items()}, index=frame.index)], axis=1)
    return frame, [n for n in names if n not in META_COLUMNS], aliases


def open_engine(db: str | Engine | None) -> Engine:
    """An engine for reading: an Engine passes through, a URL or path is opened without
    creating a schema (a missing database is a UserError, not an empty one)."""
    if isinstance(db, Engine):
        return db
    from orchestrator.store.engine import open_store_engine

    engine, _url = open_store_engine(db, auto_create=False)
    return engine


def _sweep_id(conn, sweep: str) -> int:
    sid = conn.execute(sa.select(Sweep.id).where(Sweep.name == sweep)).scalar_one_or_none()
    if sid is None:
        names = [r[0] for r in conn.execute(sa.select(Sweep.name).order_by(Sweep.name))]
        raise UserError(f"no sweep named {sweep!r} in this database (sweeps: {', '.join(names[:20]) or 'none'})")
    return sid


def _fetch_raw(conn, stmt) -> list[tuple]:
    """Rows of ``stmt`` through the DBAPI cursor: SQLAlchemy's Row objects cost seconds at
    half a million eval rows. The statement's only bound values are the sweep id and the
    validated status names, so rendering them literally is safe."""
    sql = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    cur = conn.connection.cursor()
    try:
        cur.execute(sql)
        return cur.fetchall()
    finally:
        cur.close()


def load_sweep(
    db: str | Engine | None, sweep: str, where: str | None = None, statuses: Sequence[str] = DEFAULT_STATUSES
) -> SweepData:
    """Read one sweep's trials (with the given statuses, then ``where``) and their evals."""
    statuses = list(statuses)
    bad = [x for x in statuses if x not in ALL_STATUSES]
    if bad:
        raise UserError(f"unknown trial status {bad[0]!r}; expected some of {', '.join(ALL_STATUSES)}")
    engine = open_engine(db)
    with engine.connect() as conn:
        sid = _sweep_id(conn, sweep)
        rows = conn.execute(
            sa.select(Trial.id, Trial.key, Trial.status, Trial.params)
            .where(Trial.sweep_id == sid, Trial.status.in_(statuses))
            .order_by(Trial.id)
        ).all()
        # One pass over the evals table for the whole sweep: cheaper than an IN list of
        # thousands of ids, and the where filter is applied on the frame afterwards.
        eval_rows = _fetch_raw(
            conn,
            (
                sa.select(Eval.trial_id, Eval.step, Eval.acc, Eval.loss, Eval.nonfinite.is_not(None))
                .join(Trial, Trial.id == Eval.trial_id)
                .where(Trial.sweep_id == sid, Trial.status.in_(statuses))
                .order_by(Eval.trial_id, Eval.step)
            ),
        )
        looks = [
            dict(r.record)
            for r in conn.execute(
                sa.select(SequentialLook.record).where(SequentialLook.sweep_id == sid).order_by(SequentialLook.id)
            )
        ]
        skipped = conn.execute(
            sa.select(sa.func.count(Trial.id)).where(Trial.sweep_id == sid, Trial.status == "skipped")
        ).scalar_one()
        skipped_steps = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(Trial.steps), 0)).where(
                Trial.sweep_id == sid, Trial.status == "skipped"
            )
        ).scalar_one()
        stop_steps = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(TrialStop.budget - TrialStop.step), 0))
            .join(Trial, Trial.id == TrialStop.trial_id)
            .where(Trial.sweep_id == sid)
        ).scalar_one()
        running = conn.execute(
            sa.select(sa.func.count(Trial.id)).where(Trial.sweep_id == sid, Trial.status == "running")
        ).scalar_one()
        stale = conn.execute(
            sa.select(sa.func.count(Trial.id)).where(Trial.sweep_id == sid, stale_condition(conn))
        ).scalar_one()
        budget_steps = conn.execute(  # superseded trials are no longer part of the design
            sa.select(sa.func.coalesce(sa.func.sum(Trial.steps), 0)).where(
                Trial.sweep_id == sid, Trial.status != "superseded"
            )
        ).scalar_one()
        stops = dict(
            conn.execute(
                sa.select(TrialStop.trial_id, TrialStop.step)
                .join(Trial, Trial.id == TrialStop.trial_id)
                .where(Trial.sweep_id == sid)
            ).all()
        )
    trials, params, aliases = params_frame(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
    )
    # stop: the step a trial was stopped at by the spec's stop rule (NaN: ran its budget).
    trials["stopped_at"] = [float(stops[t]) if t in stops else np.nan for t in trials["trial_id"]]
    evals = pd.DataFrame.from_records(eval_rows, columns=["trial_id", "step", "acc", "loss", "nonfinite"])
    evals = evals.astype({"trial_id": np.int64, "step": np.int64, "acc": float, "loss": float, "nonfinite": bool})
    if where and where.strip():
        keep = filter_trial_ids(trials, where)
        trials = trials[trials["trial_id"].isin(keep)].reset_index(drop=True)
        evals = evals[evals["trial_id"].isin(keep)].reset_index(drop=True)
    return SweepData(
        sweep=sweep,
        trials=trials,
        evals=evals,
        params=params,
        aliases=aliases,
        looks=looks,
        skipped=int(skipped),
        saved_steps=int(skipped_steps) + int(stop_steps),
        budget_steps=int(budget_steps),
        running=0 if "running" in statuses else int(running),
        stale=0 if "running" in statuses else int(stale),
    )


def load(
    db: str | Engine | None, sweep: str, where: str | None = None, statuses: Sequence[str] = DEFAULT_STATUSES
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Notebook entry point: ``(trials_df, evals_df)`` of a sweep (see the module docstring)."""
    data = load_sweep(db, sweep, where=where, statuses=statuses)
    return data.trials, data.evals
