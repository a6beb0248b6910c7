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

:func:`analysed_evals` (defined in :mod:`orchestrator.events`) turns the stored eval rows
into the rows the events and the person-period intervals are computed from.
"""

from __future__ import annotations

import pandas as pd

# The rules themselves live with every other event definition (orchestrator/events.py).
from orchestrator.events import RULES, analysed_evals, divergence_steps

__all__ = ["RULES", "analysed_evals", "divergence_steps", "diverged_note", "n_diverged"]


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
