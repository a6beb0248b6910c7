"""Person-period expansion for discrete-time hazard models.

Each eval point after a trial's first closes one interval (the first eval, at step 0 or
1, only starts the clock), up to and including the eval at the trial's ``time`` (its
escape, collapse or last eval; see :mod:`.events`). One row per (trial, interval):
``trial_id``, ``k`` (1 for the interval closed by the second eval), ``t`` (the step of
the closing eval: ``k * eval_every`` on the usual 1, 200, 400, ... grid) and ``event``
(1 only in the escape interval). A collapsed trial contributes its intervals up to the
collapse eval with ``event = 0``: collapse censors, as a competing risk. A diverged trial
contributes its intervals up to its last eval with a finite accuracy, or, censored at
divergence (``diverged: censor``), up to its divergence point with ``event = 0`` (see
:mod:`.diverged`: the rule decides which rows ``evals`` holds).

:func:`expand` is the vectorised path; :func:`expand_reference` the per-trial loop it is
tested against.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def expand(evals: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """Intervals of every trial in ``events`` (indexed by ``trial_id``, with ``time`` and
    ``escape_step``) from its ``evals`` (``trial_id, step`` sorted by trial then step)."""
    tid = evals["trial_id"].to_numpy()
    step = evals["step"].to_numpy()
    if len(tid) == 0:
        return pd.DataFrame(
            {
                "trial_id": np.array([], np.int64),
                "k": np.array([], np.int64),
                "t": np.array([], np.int64),
                "event": np.array([], np.int64),
            }
        )
    start = np.r_[True, tid[1:] != tid[:-1]]
    gid = np.cumsum(start) - 1
    k = np.arange(len(tid)) - np.flatnonzero(start)[gid]
    pos = events.index.get_indexer(tid)  # -1 for trials without events (filtered out)
    known = pos >= 0
    end_time = np.where(known, events["time"].to_numpy()[np.maximum(pos, 0)], -1)
    esc = np.where(known, events["escape_step"].to_numpy(dtype=float)[np.maximum(pos, 0)], np.nan)
    keep = known & (k >= 1) & (step <= end_time)
    return pd.DataFrame(
        {
            "trial_id": tid[keep].astype(np.int64),
            "k": k[keep].astype(np.int64),
            "t": step[keep].astype(np.int64),
            "event": (step[keep] == esc[keep]).astype(np.int64),
        }
    )


def expand_reference(evals: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """Reference: the same intervals built one trial at a time."""
    rows = []
    for trial_id, ev in events.iterrows():
        steps = sorted(int(s) for s in evals.loc[evals["trial_id"] == trial_id, "step"])
        escape = ev["escape_step"]
        for k, s in enumerate(steps):
            if k == 0:
                continue
            if s > ev["time"]:
                break
            rows.append(
                {"trial_id": int(trial_id), "k": k, "t": s, "event": int(escape == escape and s == int(escape))}
            )
    return pd.DataFrame(rows, columns=["trial_id", "k", "t", "event"]).astype(np.int64)


def person_period(evals: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """The model frame: intervals of every trial in ``trials`` (which carries its events,
    see :func:`.events.with_events`) with every trial column (parameters and aliases)
    attached, so a formula can name any parameter."""
    events = trials.set_index("trial_id")
    pp = expand(evals, events)
    attach = [c for c in trials.columns if c not in ("t", "k", "event")]
    info = trials[attach].set_index("trial_id")
    pos = info.index.get_indexer(pp["trial_id"].to_numpy())
    extra = info.iloc[pos].reset_index(drop=True)
    return pd.concat([pp.reset_index(drop=True), extra], axis=1)
