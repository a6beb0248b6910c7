"""Group labels from parameter values (``--by``), and picking the two groups a contrast uses.

A label is the value of the single ``by`` parameter (``ns5``, ``0.003``, ``88``) or the
values of several joined by ``/`` (``ns5/88``). Numbers print in their shortest form
(``0.001``, ``1e-05``, ``3000``), booleans as ``true``/``false``. Groups are ordered by
their values, numerically where the values are numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from orchestrator.errors import UserError


def format_value(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "NA"
    if isinstance(v, bool):
        return "true" if v else "false"
    if hasattr(v, "item") and not isinstance(v, str):  # numpy scalars
        return format_value(v.item())
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.6g}"
    return str(v)


def _sort_key(v):
    if isinstance(v, bool) or v is None:
        return (1, str(v))
    if isinstance(v, (int, float)) or hasattr(v, "item"):
        try:
            f = float(v)
            return (0, f) if not math.isnan(f) else (2, "")
        except (TypeError, ValueError):
            pass
    return (1, str(v))


def check_params(trials: pd.DataFrame, names: Sequence[str], params: Sequence[str] = (), flag: str = "--by") -> None:
    for n in names:
        if n not in trials.columns:
            known = ", ".join(list(params)[:40]) or "(none)"
            raise UserError(f"{flag} {n!r}: no such parameter; this sweep's parameters: {known}")


def labels(trials: pd.DataFrame, by: Sequence[str]) -> pd.Series:
    """One label per trial row (``all`` when ``by`` is empty)."""
    if not by:
        return pd.Series(["all"] * len(trials), index=trials.index, dtype=object)
    parts = [_formatted(trials[b]) for b in by]
    out = parts[0].astype(object)
    for p in parts[1:]:
        out = out + "/" + p
    return out


def _formatted(col: pd.Series) -> pd.Series:
    """``col.map(format_value)``, each distinct value formatted once: a typed column through
    its codes, an object column through a cache keyed by value and type (True, 1 and 1.0
    hash alike but are two labels). At 100,000 trials the per-row call took a second a view."""
    if col.dtype != object:
        codes, uniques = pd.factorize(col, use_na_sentinel=True)
        names = np.array([format_value(u) for u in uniques] + [format_value(None)], dtype=object)
        return pd.Series(names[codes], index=col.index, dtype=object)
    cache: dict[tuple, str] = {}

    def one(v):
        try:
            key = (type(v), v)
            hit = cache.get(key)
        except TypeError:  # unhashable (a list): formatted as it comes
            return format_value(v)
        if hit is None:
            hit = cache[key] = format_value(v)
        return hit

    return col.map(one)


def distinct_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s distinct rows, a value's type kept apart (True, 1 and 1.0 are equal to
    pandas but are three labels); the frame itself when a cell is unhashable (a list)."""
    if len(frame) < 2:
        return frame
    kinds = frame.apply(lambda col: col.map(type))
    try:
        keep = ~pd.concat([frame, kinds.add_prefix("\0type:")], axis=1).duplicated()
    except TypeError:
        return frame
    return frame[keep.to_numpy()]


def ordered(trials: pd.DataFrame, by: Sequence[str]) -> list[str]:
    """The distinct labels in value order."""
    if not by:
        return ["all"] if len(trials) else []
    seen: dict[str, tuple] = {}
    # Each distinct combination formatted once: a sweep of 10,000 trials has a few dozen.
    for rec in distinct_rows(trials[list(by)]).itertuples(index=False, name=None):
        lab = "/".join(format_value(v) for v in rec)
        if lab not in seen:
            seen[lab] = tuple(_sort_key(v) for v in rec)
    return sorted(seen, key=lambda lab: seen[lab])


def pick_two(available: Sequence[str], compare: Sequence[str] | None, what: str) -> tuple[str, str]:
    """The two groups of a contrast: ``compare`` when given, else the only two there are."""
    if compare:
        missing = [g for g in compare if g not in available]
        if missing:
            raise UserError(f"{what}: no group {missing[0]!r}; groups are: {', '.join(available) or '(none)'}")
        return compare[0], compare[1]
    if len(available) == 2:
        return available[0], available[1]
    raise UserError(
        f"{what} compares two groups, found {len(available)} "
        f"({', '.join(available[:12]) or 'none'}): pass --groups A,B or a "
        "--by that forms two"
    )


def strata_iter(trials: pd.DataFrame, strata: Sequence[str]):
    """``(stratum, sub_frame)`` per combination of the ``strata`` parameters' values (the
    stratum as ``{parameter: value}``), in value order; one stratum ``{}`` holding everything
    when ``strata`` is empty."""
    if not strata:
        yield {}, trials
        return
    labs = labels(trials, strata)
    for lab in ordered(trials, strata):
        sub = trials[labs == lab]
        first = sub.iloc[0]
        yield {c: _plain(first[c]) for c in strata}, sub


def strata_groups(trials: pd.DataFrame, strata: Sequence[str], by: Sequence[str]):
    """``(stratum, group, part)`` per stratum (:func:`strata_iter`) and ``by`` group in it,
    in order: the rows of every per-stratum, per-group table."""
    for stratum, sub in strata_iter(trials, strata):
        labs = labels(sub, by)
        for g in ordered(sub, by):
            yield stratum, g, sub[labs == g]


def _plain(v):
    return v.item() if hasattr(v, "item") else v
