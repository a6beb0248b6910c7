"""What ``orchestrator status`` shows: counts by status, per-axis completion, an ETA."""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from orchestrator.errors import UserError
from orchestrator.status import ALL, DONE, STALE, Status
from orchestrator.store import lease
from orchestrator.store.models import Eval, Sweep, Trial, TrialStop


def _aware(t: dt.datetime | None) -> dt.datetime | None:
    if t is None:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def sweep_status(engine: Engine, name: str | None = None) -> dict[str, Any]:
    with engine.connect() as conn:
        q = sa.select(Sweep.id, Sweep.name).order_by(Sweep.created_at)
        if name is not None:
            q = q.where(Sweep.name == name)
        sweeps = conn.execute(q).all()
        if name is not None and not sweeps:
            raise UserError(f"no sweep named {name!r} (see `orchestrator ls`)")
        now = _aware(conn.execute(sa.select(sa.func.now())).scalar_one())
        if isinstance(now, str):  # SQLite returns text for CURRENT_TIMESTAMP
            now = _aware(dt.datetime.fromisoformat(now))
        result = []
        stale_if = lease.stale_condition(conn)
        for sid, sname in sweeps:
            last = sa.select(sa.func.max(Eval.step)).where(Eval.trial_id == Trial.id).correlate(Trial).scalar_subquery()
            rows = conn.execute(
                sa.select(
                    Trial.key,
                    Trial.status,
                    Trial.params,
                    Trial.started_at,
                    Trial.finished_at,
                    Trial.error,
                    Trial.steps,
                    last.label("last_step"),
                    stale_if.label("stale"),
                ).where(Trial.sweep_id == sid)
            ).all()
            # `stale` is a view: a running trial nobody has heartbeated within the lease TTL.
            counts = {s.value: 0 for s in ALL}
            counts[STALE] = 0
            for r in rows:
                counts[STALE if r.stale else r.status] += 1
            holder = lease.holder(conn, sid)
            # Superseded trials are no part of the design any more.
            rows = [r for r in rows if r.status != Status.superseded]
            params = [r.params if isinstance(r.params, dict) else json.loads(r.params) for r in rows]
            axes: dict[str, list[dict[str, Any]]] = {}
            names = sorted({k for p in params for k in p})
            for n in names:
                values = {json.dumps(p.get(n), sort_keys=True) for p in params}
                if len(values) < 2:
                    continue
                tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])
                for p, r in zip(params, rows):
                    v = json.dumps(p.get(n), sort_keys=True)
                    tally[v][1] += 1
                    tally[v][0] += r.status in DONE
                axes[n] = [{"value": json.loads(v), "done": d, "total": t} for v, (d, t) in sorted(tally.items())]
            # Progress in training steps (finished trials count in full), so the ETA moves
            # before the first trial ends: wall time so far x (left / done). Failed trials
            # are no steps done (nor to do): they are counted as failed.
            live = [r for r in rows if r.status != Status.failed]
            total_steps = sum(r.steps or 0 for r in live)
            done_steps = sum((r.steps or 0) if r.status in DONE else min(r.last_step or 0, r.steps or 0) for r in live)
            progress = done_steps / total_steps if total_steps else None
            eta = None
            starts = [_aware(r.started_at) for r in rows if r.started_at]
            driving = holder is not None and not holder.expired
            if driving and progress and progress < 1 and starts and now is not None:
                span = (now - min(starts)).total_seconds()
                eta = span * (1 - progress) / progress if span > 0 else None
            failed = [
                {"key": r.key, "error": (r.error or "").splitlines()[0] if r.error else ""}
                for r in rows
                if r.status == Status.failed
            ]
            # Designs: steps never spent (skipped seeds' budgets, what the stop rule cut).
            skipped_steps = sum(r.steps or 0 for r in rows if r.status == Status.skipped)
            stops = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(TrialStop.budget - TrialStop.step), 0))
                .join(Trial, Trial.id == TrialStop.trial_id)
                .where(Trial.sweep_id == sid)
            ).one()
            saved = {
                "steps": int(skipped_steps + stops[1]),
                "of_steps": int(total_steps),
                "skipped_trials": counts.get(Status.skipped.value, 0),
                "stopped_trials": int(stops[0]),
                "stopped_steps": int(stops[1]),
            }
            result.append(
                {
                    "sweep": sname,
                    "total": len(rows),
                    "counts": counts,
                    "axes": axes,
                    "progress": progress,
                    "eta_s": eta,
                    "failed": failed,
                    "saved": saved,
                    "driver": holder.describe() if driving and holder else None,
                }
            )
    return {"sweeps": result}
