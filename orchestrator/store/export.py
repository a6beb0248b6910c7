"""``orchestrator export``: one sweep's tables (:func:`orchestrator.store.reader.sweep_frames`,
what the Python API's ``load`` returns) written as parquet or CSV files with its spec."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from orchestrator.errors import UserError
from orchestrator.evals import NUMBERS
from orchestrator.store.models import Eval, Trial
from orchestrator.store.reader import sweep_frames, sweep_id


# A spreadsheet runs a cell that starts with one of these as a formula (OWASP's CSV
# injection), after any leading blanks (" =1+1" runs too): a stored string is data, so such
# a cell gets a leading apostrophe. Numbers are left as they are (-0.5 is a number).
FORMULA_START = ("=", "+", "-", "@")


def csv_safe(v: object) -> object:
    """One CSV cell as a spreadsheet may open it: a string that would run as a formula
    gets a leading apostrophe; anything else is unchanged."""
    if isinstance(v, str) and (v.startswith(("\t", "\r")) or v.lstrip(" \t\r\n").startswith(FORMULA_START)):
        return "'" + v
    return v


def _portable(df: pd.DataFrame) -> pd.DataFrame:
    """Columns every reader takes: an object column holding more than one kind of value
    (a parameter that is 3 in one trial and "auto" in another) becomes text."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object:
            kinds = {type(v) for v in out[c] if v is not None and v == v}
            if len(kinds) > 1:
                out[c] = [None if v is None or v != v else str(v) for v in out[c]]
    return out


def _with_nonfinite(engine: Engine, sweep: str, evals: pd.DataFrame) -> pd.DataFrame:
    """``evals`` with the ``nonfinite`` column beside the numbers: a measurement stored as
    NULL is either not recorded or not finite, and only this column tells which (``loss=nan``).
    Placed after the numbers (orchestrator/evals.py), before the ``metrics.*`` columns."""
    with engine.connect() as conn:
        sid = sweep_id(conn, sweep)
        rows = conn.execute(
            sa.select(Eval.trial_id, Eval.step, Eval.nonfinite)
            .join(Trial, Trial.id == Eval.trial_id)
            .where(Trial.sweep_id == sid)
        ).all()
    marks = {(int(t), int(s)): n for t, s, n in rows}
    out = evals.drop(columns=["nonfinite"], errors="ignore")
    col = pd.Series(
        [marks.get((int(t), int(s))) for t, s in zip(out["trial_id"], out["step"])], index=out.index, dtype=object
    )
    at = list(out.columns).index(NUMBERS[-1]) + 1 if NUMBERS[-1] in out.columns else len(out.columns)
    out.insert(at, "nonfinite", col)
    return out


def export_sweep(engine: Engine, sweep: str, fmt: str, out_dir: str | Path) -> list[Path]:
    """Write ``trials.<fmt>``, ``evals.<fmt>`` (parquet or csv) and ``spec.yaml`` (the spec
    text stored with the sweep) under ``out_dir``; returns the paths written."""
    if fmt not in ("parquet", "csv"):
        raise UserError(f"--format {fmt!r}: expected parquet or csv")
    frames = sweep_frames(engine, sweep)
    evals = _with_nonfinite(engine, sweep, frames.evals)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, df in (("trials", frames.trials), ("evals", evals)):
        p = out / f"{name}.{fmt}"
        if fmt == "parquet":
            _portable(df).to_parquet(p, index=False, engine="pyarrow")
        else:
            safe = df.copy()
            safe.columns = [csv_safe(c) for c in safe.columns]
            for c in safe.columns:
                if safe[c].dtype == object:
                    safe[c] = safe[c].map(csv_safe)
            safe.to_csv(p, index=False)
        paths.append(p)
    spec = out / "spec.yaml"
    spec.write_text(frames.spec_text, encoding="utf-8")
    return [*paths, spec]
