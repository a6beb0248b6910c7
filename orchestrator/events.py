"""One definition of every per-trial event, for everything that decides or reports on traces.

The training loop's stop rule (:func:`escape_run`), a sequential design's look gate
(``runner/sequential.py``), the analysis (``analysis.pipeline.prepare``), the dashboard's grid
and the report all get their events here, from a trace and the whole
:class:`~orchestrator.analysis_config.AnalysisConfig` (``lockin``, ``metric``, ``escape_at``,
``collapse_below``, ``horizon``, ``diverged``, ``stopped_as``): :func:`events` is the one
entry point from stored rows to events. It sits in the shared vocabulary, below the runner,
the training loop and the analysis, so none of them keeps a copy of a rule.

Conventions (one trace = a trial's eval points in step order; the first eval, at step 0
or 1, only starts the clock and is never an event):

- ``horizon``: every trace is first cut at that step (:func:`cut`);
- the ``diverged`` rule then decides which rows are read (:func:`analysed_evals`): a trial
  diverges at its first eval point with a non-finite value (a NaN/inf loss, marked in
  ``evals.nonfinite``) or without a finite accuracy. ``at-risk`` (the default, as published
  survival analyses of such traces count it) keeps every point with a finite accuracy;
  ``censor`` ends the trace at the divergence point, which censors the trial and whose
  accuracy is not read;
- ``escape_step``: step of the first eval after the first with ``acc >= escape_at``
  (:func:`escaped`);
- ``collapse_step``: step of the first eval after the first from which every eval to the
  last has ``acc < collapse_below`` (a missing accuracy counts as below: a diverged
  trial's NaN accuracy is a dead trial);
- ``time``: the escape step, else the collapse step (censored: a competing risk), else the
  divergence step when the trace carries a censoring divergence point, else the last eval
  step (censored at the trial's own budget); ``event`` is 1 for an escape; ``end`` names
  which of ``escape``/``collapse``/``diverged``/``budget`` ended the clock;
- ``diverge_step``: the step at which the trial diverged (its first non-finite point),
  when it is within the (cut) trace;
- ``outcome`` from the final eval's accuracy, in this order: ``solved`` (>= lockin),
  ``dead`` (collapsed), ``mid`` (>= mid_at), else ``flat``;
- ``locked``: ``final_acc`` (or ``best_acc`` with ``metric="best"``) >= lockin;
- ``stopped_as: solved``: a trial the spec's stop rule ended after its sustained escape
  counts as solved and locked in (without it, its state at budget is unknown and the
  analyses of that state refuse it: :func:`n_stopped`).

:func:`trial_events` is the vectorised path; :func:`trace_events` is the per-trace
reference it is tested against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.analysis_config import AnalysisConfig


def escaped(acc: float | None, escape_at: float) -> bool:
    """Whether one eval's accuracy is at or above the escape threshold (a missing or NaN
    accuracy never is)."""
    return acc is not None and acc >= escape_at


def escape_run(trace: Sequence[Any], escape_at: float, acc: Callable[[Any], float | None] = lambda a: a) -> int:
    """How many evals at the end of a trace, its first eval never counted, have all
    escaped: the stop rule's "escape sustained for n evals" is ``escape_run(...) >= n + 1``
    (the escape eval itself and the n after it). ``acc`` reads a point's accuracy (the
    training loop passes its eval points as they are: walked from the end, nothing copied)."""
    run = 0
    for i in range(len(trace) - 1, 0, -1):
        if not escaped(acc(trace[i]), escape_at):
            break
        run += 1
    return run


def cut(evals: pd.DataFrame, horizon: int | None) -> pd.DataFrame:
    """The eval rows at or before ``horizon`` (all of them without one)."""
    if horizon is None:
        return evals
    return evals[evals["step"] <= horizon].reset_index(drop=True)


RULES = ("at-risk", "censor")


def trial_runs(tid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first and the last row of each trial's run of rows, in a table of trial ids
    sorted by trial (``tid`` not empty)."""
    start = np.flatnonzero(np.r_[True, tid[1:] != tid[:-1]])
    return start, np.r_[start[1:], len(tid)] - 1


def divergence_steps(evals: pd.DataFrame) -> np.ndarray:
    """Per row, the step at which the row's trial diverged (NaN: it never did); ``evals``
    sorted by trial then step, with ``acc`` and optionally ``nonfinite``."""
    tid = evals["trial_id"].to_numpy()
    if len(tid) == 0:
        return np.array([], dtype=float)
    bad = ~np.isfinite(evals["acc"].to_numpy(dtype=float))
    if "nonfinite" in evals:
        bad |= evals["nonfinite"].to_numpy(dtype=bool)
    if not bad.any():
        return np.full(len(tid), np.nan)  # no trial diverged: the common case, no grouping
    step = evals["step"].to_numpy(dtype=float)
    marked = np.where(bad, step, np.nan)
    if len(tid) > 1 and not bool(np.all(tid[1:] >= tid[:-1])):
        # Out of order (not as documented, but not wrong): pandas groups wherever a trial's rows are.
        return pd.Series(marked).groupby(tid).transform("min").to_numpy(dtype=float)  # min skips NaN
    # Each trial's rows in one run: the smallest marked step per run, spread over the run.
    start, end = trial_runs(tid)
    with np.errstate(invalid="ignore"):
        first = np.fmin.reduceat(marked, start)  # fmin skips NaN
    return np.repeat(first, end - start + 1)


def analysed_evals(evals: pd.DataFrame, rule: str) -> pd.DataFrame:
    """The rows the analysis reads under ``rule``, with two more columns: ``diverge_step``
    (the trial's divergence step, NaN when none) and ``censor`` (True on the divergence
    point that censors its trial; only under ``censor``)."""
    if rule not in RULES:
        raise ValueError(f"diverged rule {rule!r}: expected one of {', '.join(RULES)}")
    div = divergence_steps(evals)
    step = evals["step"].to_numpy(dtype=float)
    finite_acc = np.isfinite(evals["acc"].to_numpy(dtype=float))
    if rule == "at-risk":
        keep = finite_acc
        censor = np.zeros(len(step), dtype=bool)
    else:
        with np.errstate(invalid="ignore"):
            before = np.isnan(div) | (step < div)
            censor = step == div
        keep = before | censor
    # A new frame over the same column arrays: ``assign`` copies every column and merges
    # them into 2-D blocks (0.5 s at 5 million rows). The rows are read, never changed, as
    # the shared eval frame they come from (analysis.data.load_sweep) is not.
    out = pd.DataFrame(
        {**{c: evals[c] for c in evals.columns}, "diverge_step": div, "censor": censor}, index=evals.index, copy=False
    )
    if keep.all() and out.index.equals(pd.RangeIndex(len(out))):
        return out
    return out[keep].reset_index(drop=True)


EVENT_COLUMNS = (
    "n_evals",
    "first_step",
    "last_step",
    "final_acc",
    "best_acc",
    "escape_step",
    "collapse_step",
    "diverge_step",
    "time",
    "event",
    "end",
    "outcome",
    "metric_acc",
    "locked",
)
OUTCOMES = ("solved", "mid", "flat", "dead")


def trace_events(
    trace: Sequence[tuple[int, float | None]],
    cfg: AnalysisConfig,
    diverge_step: int | None = None,
    censor: bool = False,
) -> dict:
    """Reference: the events of one trace, a list of ``(step, acc)`` in step order.
    ``diverge_step``: the trial's divergence step; with ``censor`` the trace's last point is
    that divergence point, which censors the trial and whose accuracy is not read."""
    steps = [int(s) for s, _ in trace]
    accs = [float("nan") if a is None else float(a) for _, a in trace]
    n = len(steps)
    if n == 0:
        return {}
    if censor:
        assert diverge_step is not None and steps[-1] == diverge_step
        accs[-1] = float("nan")
    escape = None
    for i in range(1, n):
        if escaped(accs[i], cfg.escape_at):
            escape = steps[i]
            break
    collapse = None
    for i in range(1, n - int(censor)):
        if all(not (a >= cfg.collapse_below) for a in accs[i:]):
            collapse = steps[i]
            break
    if escape is not None:
        time, end = escape, "escape"
    elif collapse is not None:
        time, end = collapse, "collapse"
    elif censor:
        time, end = steps[-1], "diverged"
    else:
        time, end = steps[-1], "budget"
    final = accs[-2] if censor and n > 1 else accs[-1]
    finite = [a for a in accs if a == a]
    best = max(finite) if finite else float("nan")
    if final >= cfg.lockin:
        outcome = "solved"
    elif collapse is not None:
        outcome = "dead"
    elif final >= cfg.mid_at:
        outcome = "mid"
    else:
        outcome = "flat"
    metric = final if cfg.metric == "final" else best
    return {
        "n_evals": n,
        "first_step": steps[0],
        "last_step": steps[-1],
        "final_acc": final,
        "best_acc": best,
        "escape_step": escape,
        "collapse_step": collapse,
        "diverge_step": diverge_step if diverge_step is not None and diverge_step <= steps[-1] else None,
        "time": time,
        "event": int(escape is not None),
        "end": end,
        "outcome": outcome,
        "metric_acc": metric,
        "locked": bool(metric >= cfg.lockin),
    }


def trial_events(evals: pd.DataFrame, cfg: AnalysisConfig) -> pd.DataFrame:
    """Events of every trial in ``evals`` (columns ``trial_id, step, acc``, sorted by trial
    then step, optionally ``diverge_step`` and ``censor`` from :func:`.diverged.analysed_evals`),
    one row per trial indexed by ``trial_id``; columns :data:`EVENT_COLUMNS`.
    ``escape_step``/``collapse_step``/``diverge_step`` are NaN where there is none."""
    if evals.empty:
        return pd.DataFrame(columns=list(EVENT_COLUMNS), index=pd.Index([], name="trial_id"))
    tid = evals["trial_id"].to_numpy()
    step = evals["step"].to_numpy()
    acc = evals["acc"].to_numpy(dtype=float)
    # A censoring divergence point (the last of its trace) ends the clock; its accuracy is
    # not read: no escape there, and it neither starts nor breaks a collapse.
    censor = evals["censor"].to_numpy(dtype=bool) if "censor" in evals else np.zeros(len(tid), dtype=bool)
    acc = np.where(censor, np.nan, acc)
    # Group boundaries of the sorted trace table.
    gstart, gend = trial_runs(tid)
    gid = np.repeat(np.arange(len(gstart)), gend - gstart + 1)
    k = np.arange(len(tid)) - gstart[gid]  # position of each eval within its trace
    ids = tid[gstart]
    ng = len(ids)

    def first_step_where(mask: np.ndarray) -> np.ndarray:
        out = np.full(ng, np.nan)
        idx = np.flatnonzero(mask)
        if idx.size:
            g = gid[idx]
            first = np.r_[True, g[1:] != g[:-1]]
            out[g[first]] = step[idx[first]]
        return out

    with np.errstate(invalid="ignore"):
        up = acc >= cfg.escape_at
        low = ~(acc >= cfg.collapse_below)
    escape = first_step_where(up & (k >= 1))
    # low_suffix[i]: every eval from i to the end of its trace is low. A running count of
    # "not low" from the end of each trace is zero exactly there.
    notlow = (~low).astype(np.int64)
    rev_cum = np.cumsum(notlow[::-1])[::-1]  # not-low evals from i to the end of the table
    after = np.r_[rev_cum[1:], 0]
    low_suffix = (rev_cum - after[gend[gid]]) == 0
    collapse = first_step_where(low_suffix & (k >= 1) & ~censor)
    censored_at = first_step_where(censor)

    last = step[gend].astype(float)
    # The final accuracy is the last one read: before a censoring divergence point.
    prev = np.maximum(gend - 1, gstart)
    final = np.where(censor[gend], np.where(gend > gstart, acc[prev], np.nan), acc[gend])
    with np.errstate(invalid="ignore"):
        best = np.fmax.reduceat(acc, gstart)  # skips NaN (NaN where a trace has no accuracy)
    if "diverge_step" in evals:
        div = evals["diverge_step"].to_numpy(dtype=float)[gstart]
        with np.errstate(invalid="ignore"):
            div = np.where(div <= last, div, np.nan)  # a horizon may cut the trace before it
    else:
        div = np.full(ng, np.nan)
    has_esc = ~np.isnan(escape)
    has_col = ~np.isnan(collapse)
    has_cen = ~np.isnan(censored_at)
    time = np.where(has_esc, escape, np.where(has_col, collapse, np.where(has_cen, censored_at, last)))
    end = np.where(has_esc, "escape", np.where(has_col, "collapse", np.where(has_cen, "diverged", "budget")))
    with np.errstate(invalid="ignore"):
        outcome = np.select([final >= cfg.lockin, has_col, final >= cfg.mid_at], ["solved", "dead", "mid"], "flat")
        metric = final if cfg.metric == "final" else best
        locked = metric >= cfg.lockin
    out = pd.DataFrame(
        {
            "n_evals": gend - gstart + 1,
            "first_step": step[gstart],
            "last_step": step[gend],
            "final_acc": final,
            "best_acc": best,
            "escape_step": escape,
            "collapse_step": collapse,
            "diverge_step": div,
            "time": time.astype(np.int64),
            "event": has_esc.astype(np.int64),
            "end": end,
            "outcome": outcome,
            "metric_acc": metric,
            "locked": locked,
        },
        index=pd.Index(ids, name="trial_id"),
    )
    return out


def with_events(trials: pd.DataFrame, evals: pd.DataFrame, cfg: AnalysisConfig) -> pd.DataFrame:
    """``trials`` joined with their events; trials without any eval are dropped (they have
    no clock to start)."""
    ev = trial_events(evals, cfg)
    clash = [c for c in ev.columns if c in trials.columns]
    merged = trials.drop(columns=clash).join(ev, on="trial_id", how="inner")
    return merged.reset_index(drop=True)


def n_stopped(trials: pd.DataFrame) -> int:
    """Trials the spec's stop rule ended (they carry ``stopped_at``)."""
    return int(trials["stopped_at"].notna().sum()) if "stopped_at" in trials else 0


def events(trials: pd.DataFrame, evals: pd.DataFrame, cfg: AnalysisConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """From stored rows to events, the whole rule: ``evals`` (``trial_id, step, acc`` sorted
    by trial then step, optionally ``nonfinite``) cut at ``cfg.horizon`` and read under
    ``cfg.diverged``; ``trials`` (``trial_id``, optionally ``stopped_at``) joined with their
    events, ``cfg.stopped_as`` applied. Returns (the analysed eval rows, the trials with their
    events); trials without an eval are dropped (no clock to start)."""
    rows = analysed_evals(cut(evals, cfg.horizon), cfg.diverged)
    out = with_events(trials, rows, cfg)
    if cfg.stopped_as == "solved" and "stopped_at" in out:
        # The stated imputation rule: a trial stopped after a sustained escape counts as solved.
        stopped = out["stopped_at"].notna()
        out.loc[stopped, "locked"] = True
        out.loc[stopped, "outcome"] = "solved"
    return rows, out


def rule_text(cfg: AnalysisConfig, *, survival: bool) -> str:
    """The event rule an analysis read, in one line: lock-in's threshold and metric for the
    state at the budget, or the escape threshold and what censors for escape times."""
    cut = f"; traces cut at step {cfg.horizon}" if cfg.horizon else ""
    if survival:
        return (
            f"escape: the first eval after the first with accuracy >= {cfg.escape_at:g} "
            f"(a collapse below {cfg.collapse_below:g} to the end censors){cut}"
        )
    which = "final" if cfg.metric == "final" else "best"
    stopped = "; trials the stop rule ended count as solved" if cfg.stopped_as == "solved" else ""
    return f"lock-in: {which} eval accuracy >= {cfg.lockin:g}{cut}{stopped}"
