"""How a diverged trial counts in the escape-time analyses (``AnalysisConfig.diverged``).

A trial diverges at its first eval point with a non-finite value (a NaN/inf loss: the store
keeps the point, its finite accuracy included, and marks it in ``evals.nonfinite``) or
without a finite accuracy. Two rules:

- ``at-risk`` (the default): the trial is at risk until its last eval with a finite
  accuracy, as published survival analyses of such traces count it (the scaffold study
  regenerates its hazard fits from released per-seed traces whose NaN-loss points keep
  their accuracy). Every point with a finite accuracy is part of the trace, before or after
  the divergence; points without one are left out.
- ``censor``: the trial is censored at divergence. Its trace ends at the divergence point,
  which closes its last at-risk interval without an event (as a collapse does) and whose
  accuracy is not read: an escape must come before it.

:func:`analysed_evals` turns the stored eval rows into the rows the events
(:func:`.events.trial_events`) and the person-period intervals are computed from.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

RULES = ("at-risk", "censor")


def divergence_steps(evals: pd.DataFrame) -> np.ndarray:
    """Per row, the step at which the row's trial diverged (NaN: it never did); ``evals``
    sorted by trial then step, with ``acc`` and optionally ``nonfinite``."""
    tid = evals["trial_id"].to_numpy()
    if len(tid) == 0:
        return np.array([], dtype=float)
    bad = ~np.isfinite(evals["acc"].to_numpy(dtype=float))
    if "nonfinite" in evals:
        bad |= evals["nonfinite"].to_numpy(dtype=bool)
    step = evals["step"].to_numpy(dtype=float)
    first = pd.Series(np.where(bad, step, np.nan)).groupby(tid).transform("min")  # min skips NaN
    return first.to_numpy(dtype=float)


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
    out = evals.assign(diverge_step=div, censor=censor)
    return out[keep].reset_index(drop=True)


def n_diverged(trials: pd.DataFrame) -> int:
    """Trials (carrying their events) that diverged within their analysed trace."""
    return int(trials["diverge_step"].notna().sum()) if "diverge_step" in trials else 0


def diverged_note(rule: str, n_diverged: int, n_trials: int) -> str:
    """One line saying how the diverged trials were counted."""
    how = (
        "at risk until their last eval with a finite accuracy (--diverged at-risk; 'censor' censors them at divergence)"
        if rule == "at-risk"
        else "censored at divergence, their first non-finite point (--diverged censor; 'at-risk' "
        "keeps them at risk until their last eval with a finite accuracy)"
    )
    return f"diverged (a non-finite loss or accuracy): {n_diverged} of {n_trials} trial(s), {how}"
