"""Trials and eval traces of one sweep, read from the store into pandas.

``trials`` has one row per trial: ``trial_id``, ``key``, ``status`` and every
resolved parameter as a column under its full dotted name, plus two aliases per dotted
name where they do not clash: the short name (the part after the last dot) when no other
parameter shares it, and the name with non-identifier characters as underscores (what a
patsy formula can use), and ``code_version``, ``host`` and ``device`` of the attempt that
produced the trial's trace (None for a trial that ran before attempts were recorded). ``evals`` has ``trial_id, step, acc, loss, nonfinite``, sorted by
trial and step: every stored point, a diverged trial's too (``nonfinite`` is True where
the point had a non-finite value, stored as NULL: a NaN loss beside a finite accuracy);
how the analyses count those is :mod:`.diverged`. Both come from the store's reader
(:func:`orchestrator.store.reader.analysis_rows`); nothing here writes.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sqlalchemy.engine import Engine

from orchestrator.errors import UserError
from orchestrator.status import Status
from orchestrator.store import reader

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
    # Failed trials the status filter leaves out (a failed trial has no outcome to count).
    failed: int = 0

    def unfinished_note(self) -> str | None:
        """One line about the running, stale and failed trials not in the analysis, or None."""
        parts = []
        if self.running:
            stale = (
                f", {self.stale} of them stale (no heartbeat: their driver is gone; `orchestrator resume` re-runs them)"
                if self.stale
                else ""
            )
            parts.append(f"{self.running} trial(s) still running{stale}")
        if self.failed:
            parts.append(
                f"the sweep's {self.failed} failed trial(s) (`orchestrator status {self.sweep}` shows why; "
                "`orchestrator resume` retries them)"
            )
        if not parts:
            return None
        return " and ".join(parts) + " are not in this analysis"

    def column(self, name: str) -> str:
        """The trials column for a parameter given by full name or alias."""
        return resolve_column(self.trials, name, self.params)

    def __iter__(self):
        """``trials, evals = load_sweep(...)``."""
        return iter((self.trials, self.evals))


def resolve_column(trials: pd.DataFrame, name: str, params: Sequence[str] = ()) -> str:
    if name in trials.columns:
        return name
    known = ", ".join([*list(params)[:40], *reader.PROVENANCE_COLUMNS])
    raise UserError(f"unknown parameter {name!r}; this sweep's parameters: {known}")


def formula_name(name: str) -> str:
    """A parameter name as a Python identifier (dots and other symbols become ``_``)."""
    out = re.sub(r"\W", "_", name)
    return f"_{out}" if out[:1].isdigit() else out


def params_frame(
    ids: Sequence[int], keys: Sequence[str], statuses: Sequence[str], params: Sequence[dict]
) -> tuple[pd.DataFrame, list[str], dict[str, str]]:
    """Build the trials frame (see the module docstring) from raw trial rows."""
    frame = pd.DataFrame({"trial_id": np.asarray(ids, dtype=np.int64), "key": list(keys), "status": list(statuses)})
    param_df, names = reader.param_columns(params, frame.index)
    # A parameter named like a trial's own column (an imported ``status``) is kept, as
    # ``params.<name>`` (load and export name it so too): never dropped, never shadowing.
    clash = {n: f"params.{n}" for n in names if n in META_COLUMNS}
    param_df, names = param_df.rename(columns=clash), [clash.get(n, n) for n in names]
    frame = pd.concat([frame, param_df], axis=1)
    aliases: dict[str, str] = {}
    # (meta columns are left out of the count: a short name equal to one is taken anyway)
    shorts = Counter(n.rsplit(".", 1)[-1] for n in names)
    taken = set(frame.columns)
    for n in names:
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
    return frame, names, aliases


def tuples_frame(rows: Sequence[tuple], dtypes: Mapping[str, Any]) -> pd.DataFrame:
    """Database rows (tuples) as a frame with these columns and dtypes, through one numpy
    record array: a third of ``DataFrame.from_records``'s time at half a million eval rows
    (a sweep page's grid reads them cold). A NULL in a float column is NaN."""
    arr = np.array(rows, dtype=[(name, np.dtype(t)) for name, t in dtypes.items()])
    return pd.DataFrame({name: arr[name] for name in dtypes})


# The evals frame's columns and their dtypes.
EVAL_DTYPES: dict[str, Any] = {"trial_id": np.int64, "step": np.int64, "acc": float, "loss": float, "nonfinite": bool}
# Eval rows read and packed at a time by :func:`read_evals`.
EVAL_CHUNK = 100_000


def by_trial_and_step(evals: pd.DataFrame) -> pd.DataFrame:
    """``evals`` sorted by trial and step (as it is when already so: no copy)."""
    tid, step = evals["trial_id"].to_numpy(), evals["step"].to_numpy()
    if len(tid) < 2:
        return evals
    dt, ds = np.diff(tid), np.diff(step)
    if bool(np.all((dt > 0) | ((dt == 0) & (ds >= 0)))):
        return evals
    order = np.lexsort((step, tid))
    return evals.take(order).reset_index(drop=True)


def read_evals(
    db: str | Engine | None, sweep: str, trial_ids: tuple[int, int | None] | None = None, *, columnar: bool = False
) -> pd.DataFrame:
    """Every eval point of ``sweep`` (trials of any status) as the evals frame of
    :class:`SweepData`, sorted by trial and step: one read that several analyses of one
    sweep share (``load_sweep(..., evals=)``; the dashboard's grid, escape-time curves and
    quantile bands). Read in chunks without an ORDER BY and sorted here on arrays: 5
    million rows cost the database's sort seconds and their Python tuples gigabytes.
    ``trial_ids``: only the trials with ``lo <= id < hi`` (:func:`reader.trial_id_bounds`);
    the frames of consecutive ranges, concatenated, are the whole read. ``columnar``: read
    through the backend's columnar driver where it has one (:func:`reader.eval_point_arrays`:
    under half the CPU, and no deadline reaches it, so ``ui.offload``'s children use it); the
    frame is the same."""
    engine = reader.open_engine(db)
    with engine.connect() as conn:
        sid = reader.sweep_id(conn, sweep)
        arrays = reader.eval_point_arrays(conn, sid, EVAL_DTYPES, trial_ids) if columnar else None
        if arrays is not None:
            return by_trial_and_step(pd.DataFrame(arrays, copy=False))  # not copied into 2-D blocks
        chunks = reader.eval_point_chunks(conn, sid, EVAL_CHUNK, trial_ids)
        parts = [tuples_frame(c, EVAL_DTYPES) for c in chunks]
    if not parts:
        return tuples_frame([], EVAL_DTYPES)
    frame = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    return by_trial_and_step(frame)


def load_sweep(
    db: str | Engine | None,
    sweep: str,
    where: str | None = None,
    statuses: Sequence[str] = DEFAULT_STATUSES,
    *,
    evals: pd.DataFrame | Callable[[], pd.DataFrame] | None = None,
    known_params: Mapping[int, Mapping[str, Any]] | None = None,
) -> SweepData:
    """Read one sweep's trials (with the given statuses, then ``where``) and their evals.
    ``evals``: the sweep's :func:`read_evals` frame, read already (then only the trials are
    read, and the frame is cut to them; it is not changed), or a function that gives it,
    called once the trials are read (the dashboard's shared read, still under way in other
    processes while this one reads the trials). ``known_params``: trial id -> params decoded
    already (:func:`orchestrator.store.reader.analysis_rows`)."""
    statuses = list(statuses)
    bad = [x for x in statuses if x not in ALL_STATUSES]
    if bad:
        raise UserError(f"unknown trial status {bad[0]!r}; expected some of {', '.join(ALL_STATUSES)}")
    stored = reader.analysis_rows(
        reader.open_engine(db), sweep, statuses, with_evals=evals is None, known_params=known_params
    )
    rows, stops = stored.trials, stored.stops
    trials, params, aliases = params_frame(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
    )
    # stop: the step a trial was stopped at by the spec's stop rule (NaN: ran its budget).
    trials["stopped_at"] = [float(stops[t]) if t in stops else np.nan for t in trials["trial_id"]]
    # Where and with which code each trial's newest attempt ran, so a confound check is one
    # ``--by code_version`` (``device`` here is where it ran, not the ``device:`` setting).
    for i, col in enumerate(reader.PROVENANCE_COLUMNS):
        trials[col] = [stored.provenance[t][i] if t in stored.provenance else None for t in trials["trial_id"]]
    frame: pd.DataFrame
    if evals is None:
        frame = tuples_frame(stored.evals, EVAL_DTYPES)
    else:
        frame = evals() if callable(evals) else evals
        # The shared frame holds every status's trials: keep this read's (a trial that
        # changed status between the two reads is counted as the trials read say). When it
        # keeps them all the frame is shared as it is, not copied (it is never changed here).
        mine = frame["trial_id"].isin(trials["trial_id"].to_numpy()).to_numpy()
        if not (mine.all() and frame.index.equals(pd.RangeIndex(len(frame)))):
            frame = frame[mine].reset_index(drop=True)
    if where and where.strip():
        keep = filter_trial_ids(trials, where)
        trials = trials[trials["trial_id"].isin(keep)].reset_index(drop=True)
        frame = frame[frame["trial_id"].isin(keep)].reset_index(drop=True)
    return SweepData(
        sweep=sweep,
        trials=trials,
        evals=frame,
        params=params,
        aliases=aliases,
        looks=stored.looks,
        skipped=stored.skipped,
        saved_steps=stored.saved_steps,
        budget_steps=stored.budget_steps,
        running=0 if Status.running in statuses else stored.running,
        stale=0 if Status.running in statuses else stored.stale,
        failed=0 if Status.failed in statuses else stored.failed,
    )
