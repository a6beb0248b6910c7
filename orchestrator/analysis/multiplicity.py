"""Multiplicity: adjusting a family of p-values (``cfg.adjust``), the one place every table
that prints several tests goes through.

A family is what one table prints: the per-stratum log-rank tests (``analyze logrank
--strata``, the report's table B), or every test of the report's contrast table F (each
contrast x stratum x test). A single test is a family of one, which no method changes.
Methods are statsmodels' (:func:`statsmodels.stats.multitest.multipletests`): ``holm``
(the default: family-wise error under any dependence, and the tests of one table share
trials), ``bh`` (Benjamini-Hochberg false discovery rate, for screens), ``bonferroni``, or
``none``. An untestable entry (p-value None: no escapes, a group missing) is no member of
its family and its adjusted p-value stays None.

Raw p-values keep their key (``p_value``) in the JSON; the adjusted one is ``p_adjusted``
beside it and the family's method is ``adjust``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

METHODS = ("holm", "bh", "bonferroni", "none")
# Our names (short, as the option is typed) to statsmodels' method names.
_STATSMODELS = {"holm": "holm", "bh": "fdr_bh", "bonferroni": "bonferroni"}
# The families, as the notes and the JSON name them.
STRATA_FAMILY = "the per-stratum log-rank tests"
CONTRASTS_FAMILY = "this table (every contrast x stratum x test)"
# The tests of a contrast entry (report table F) whose p_value joins the family.
CONTRAST_TESTS = ("fisher", "permutation", "logrank", "mcnemar")


def adjust(ps: Sequence[float | None], method: str) -> list[float | None]:
    """The adjusted p-values of ``ps`` in their order; None (and NaN) entries stay None and
    do not count towards the family's size."""
    if method not in METHODS:
        raise ValueError(f"adjust {method!r}: expected one of {', '.join(METHODS)}")
    present = {i: float(p) for i, p in enumerate(ps) if p is not None and not math.isnan(p)}
    out: list[float | None] = [None] * len(ps)
    if method == "none" or not present:
        for i, p in present.items():
            out[i] = p
        return out
    if method == "holm":
        adjusted = _holm(list(present.values()))
    else:
        from statsmodels.stats.multitest import multipletests

        adjusted = multipletests(list(present.values()), method=_STATSMODELS[method])[1]
    for i, q in zip(present, adjusted):
        out[i] = float(q)
    return out


def _holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment, as statsmodels' ``multipletests(method="holm")`` computes
    it (sorted, times m - i + 1, running maximum, capped at 1; tests/test_analysis_multiplicity.py
    compares the two). Not called there: its holm branch runs ``gc.collect()`` on every call,
    0.2 s in a process that holds torch and pandas, and a report or the dashboard adjusts one
    family per table."""
    import numpy as np

    p = np.asarray(ps, dtype=float)
    order = np.argsort(p)
    adjusted = np.minimum(np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1)), 1.0)
    out = np.empty_like(adjusted)
    out[order] = adjusted
    return [float(q) for q in out]


def annotate(tests: Iterable[dict[str, Any] | None], method: str, key: str = "p_value") -> None:
    """Adjust the ``key`` p-values of ``tests`` (dicts, as ``to_dict()`` gives them) as one
    family: each dict gets ``p_adjusted`` and ``adjust`` (the method); None tests are
    skipped, a None p-value gets a None ``p_adjusted``."""
    family = [t for t in tests if t is not None]
    for t, q in zip(family, adjust([t.get(key) for t in family], method)):
        t["p_adjusted"] = q
        t["adjust"] = method


def note(method: str, family: str) -> str:
    """The line a table of a family prints above its p-values."""
    if method == "none":
        return f"p-values not adjusted for multiplicity (--adjust none) within {family}"
    return f"p-values adjusted within {family}: {method} (raw p in parentheses)"


def p_text(d: dict[str, Any], key: str = "p_value") -> str:
    """``p = 0.03 (raw p = 0.01)`` for a test of an adjusted family, ``p = 0.01`` otherwise
    (a lone test, or ``--adjust none``)."""
    raw = d[key]
    q = d.get("p_adjusted")
    if q is None or d.get("adjust") in (None, "none"):
        return f"p = {raw:.4g}"
    return f"p = {q:.4g} (raw p = {raw:.4g})"
