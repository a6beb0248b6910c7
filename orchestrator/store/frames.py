"""One sweep as plain tables: what the Python API's ``load`` returns and what ``orchestrator
export`` writes. Column names are the SQL ones (``key``, ``step_lr``, ...); every parameter is
one column under its full dotted name (no short or formula aliases: those are the analysis
layer's conveniences); ``metrics`` is expanded into one ``metrics.<name>`` column per metric.
Reads only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from orchestrator.errors import UserError
from orchestrator.params import flatten_params
from orchestrator.store.models import Eval, Sweep, Trial

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
EVAL_COLUMNS = ("trial_id", "step", "acc", "loss", "train_loss", "step_lr", "elapsed_s")


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


def _cell(v: Any) -> Any:
    # Lists and dicts as their JSON text: one scalar per cell, readable by any tool.
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v


def read_sweep(engine: Engine, sweep: str) -> SweepFrames:
    """Every trial (any status) and every eval point of ``sweep``."""
    t = Trial.__table__
    with engine.connect() as conn:
        row = conn.execute(sa.select(Sweep.id, Sweep.spec_text).where(Sweep.name == sweep)).first()
        if row is None:
            names = [r[0] for r in conn.execute(sa.select(Sweep.name).order_by(Sweep.name))]
            raise UserError(f"no sweep named {sweep!r} in this database (sweeps: {', '.join(names[:20]) or 'none'})")
        cols = [t.c.id.label("trial_id")] + [t.c[c] for c in TRIAL_COLUMNS[1:]] + [t.c.params]
        trows = conn.execute(sa.select(*cols).where(t.c.sweep_id == row.id).order_by(t.c.id)).mappings().all()
        erows = conn.execute(
            sa.select(
                Eval.trial_id,
                Eval.step,
                Eval.acc,
                Eval.loss,
                Eval.train_loss,
                Eval.step_lr,
                Eval.elapsed_s,
                Eval.metrics,
            )
            .join(Trial, Trial.id == Eval.trial_id)
            .where(Trial.sweep_id == row.id)
            .order_by(Eval.trial_id, Eval.step)
        ).all()
    flat = [{k: _cell(v) for k, v in flatten_params(r["params"] or {}).items()} for r in trows]
    params = list(dict.fromkeys(k for f in flat for k in f if k not in TRIAL_COLUMNS))
    trials = pd.DataFrame({c: [r[c] for r in trows] for c in TRIAL_COLUMNS})
    trials = pd.concat(
        [trials, pd.DataFrame({p: [f.get(p) for f in flat] for p in params}, index=trials.index).infer_objects()],
        axis=1,
    )
    evals = pd.DataFrame([tuple(r[:7]) for r in erows], columns=list(EVAL_COLUMNS))
    evals = evals.astype(
        {
            "trial_id": "int64",
            "step": "int64",
            "acc": float,
            "loss": float,
            "train_loss": float,
            "step_lr": float,
            "elapsed_s": float,
        }
    )
    metrics = [r[7] if isinstance(r[7], dict) else (json.loads(r[7]) if r[7] else {}) for r in erows]
    names = list(dict.fromkeys(k for m in metrics for k in m))
    if names:
        evals = pd.concat(
            [
                evals,
                pd.DataFrame(
                    {f"metrics.{n}": [_cell(m.get(n)) for m in metrics] for n in names}, index=evals.index
                ).infer_objects(),
            ],
            axis=1,
        )
    return SweepFrames(sweep=sweep, trials=trials, evals=evals, spec_text=row.spec_text, params=params)


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


def export_sweep(engine: Engine, sweep: str, fmt: str, out_dir: str | Path) -> list[Path]:
    """Write ``trials.<fmt>``, ``evals.<fmt>`` (parquet or csv) and ``spec.yaml`` (the spec
    text stored with the sweep) under ``out_dir``; returns the paths written."""
    if fmt not in ("parquet", "csv"):
        raise UserError(f"--format {fmt!r}: expected parquet or csv")
    frames = read_sweep(engine, sweep)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, df in (("trials", frames.trials), ("evals", frames.evals)):
        p = out / f"{name}.{fmt}"
        if fmt == "parquet":
            _portable(df).to_parquet(p, index=False, engine="pyarrow")
        else:
            df.to_csv(p, index=False)
        paths.append(p)
    spec = out / "spec.yaml"
    spec.write_text(frames.spec_text, encoding="utf-8")
    return [*paths, spec]
