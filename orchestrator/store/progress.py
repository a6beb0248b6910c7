"""What ``orchestrator status`` shows (and the dashboard's index, and ``status --watch``): per
sweep, counts by status, per-axis completion, progress in training steps and an ETA."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from sqlalchemy.engine import Engine

from orchestrator.status import ALL, DONE, STALE, Status
from orchestrator.store import claims, lease, reader, retention


def progress_report(engine: Engine, name: str | None = None) -> dict[str, Any]:
    """``{"sweeps": [...]}``: every sweep, or the one called ``name`` (:class:`~orchestrator.
    store.reader.UnknownSweep` when there is none)."""
    with engine.connect() as conn:
        sweeps = reader.sweeps_by_creation(conn, name)
        if name is not None and not sweeps:
            raise reader.UnknownSweep(name, reader.sweep_names(conn))
        now = reader.db_now(conn)
        result = []
        for sid, sname in sweeps:
            rows = reader.progress_rows(conn, sid)
            # `stale` is a view: a running trial nobody has heartbeated within the lease TTL.
            counts = {s.value: 0 for s in ALL}
            counts[STALE] = 0
            for r in rows:
                counts[STALE if r.stale else r.status] += 1
            holder = lease.holder(conn, sid)
            live = claims.drivers(conn, sid, ttl=lease.lease_ttl_s(), live_only=True)
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
            # before the first trial ends: wall time so far x (left / done). A failed trial
            # counts the steps it ran, and the rest of its budget as not done: a sweep with a
            # failed trial is never "100% of steps" (`resume` retries it).
            total_steps = sum(r.steps or 0 for r in rows)
            done_steps = sum(
                (r.steps or 0)
                if r.status in DONE and r.status != Status.failed
                else min(r.last_step or 0, r.steps or 0)
                for r in rows
            )
            progress = done_steps / total_steps if total_steps else None
            eta = None
            starts = [reader.aware(r.started_at) for r in rows if r.started_at]
            driving = bool(live) or (holder is not None and not holder.expired)
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
            stopped, stopped_steps = reader.stopped_savings(conn, sid)
            saved = {
                "steps": int(skipped_steps + stopped_steps),
                "of_steps": int(total_steps),
                "skipped_trials": counts.get(Status.skipped.value, 0),
                "stopped_trials": stopped,
                "stopped_steps": stopped_steps,
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
                    # eval rows (an estimate) and checkpoints (exact) it keeps: store/retention.py
                    "stored": retention.stored_size(conn, sid),
                    "driver": (live[0].summary() if live else holder.summary() if driving and holder else None),
                    # every live driver (orchestrator join): what it holds and its heartbeat
                    "drivers": [
                        {
                            "owner": d.owner,
                            "host": d.host,
                            "pid": d.pid,
                            "command": d.command,
                            "slurm_job": d.slurm_job,
                            "claimed": d.claimed,
                            "running": d.running,
                            "started_at": d.started_at,
                            "heartbeat_at": d.heartbeat_at,
                        }
                        for d in live
                    ],
                    # every code and torch version that ran attempts of it (migration 0007)
                    "environments": [
                        {"code_version": e.code_version, "torch_version": e.torch_version, "trials": e.trials}
                        for e in reader.environments(conn, sid)
                    ],
                }
            )
    return {"sweeps": result}
