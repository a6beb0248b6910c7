"""`orchestrator bench store`: how fast eval rows go into the store, what streaming costs a
training run, and how much of a sweep's wall time is spent training.

1. Ingest: eval rows upserted in the writer's batch size into a fresh SQLite file and (when
   a URL is given) a fresh PostgreSQL schema; rows/s.
2. Streaming slowdown: the same trial trained twice side by side (interleaved repeats,
   medians) at eval_every=10, once discarding its eval points and once writing each one
   through the same buffered upsert path the driver uses, in the training process itself
   (an upper bound: in a sweep the writer runs in the driver, off the training path).
3. Sweep efficiency: a sweep of many short trials through Ray Tune; the share of the slots'
   wall time spent inside the training loop (sum of the trials' own elapsed time divided by
   wall time x concurrent slots).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from orchestrator.store import dialect, repo
from orchestrator.store.engine import open_store_engine

BATCH = 2000  # the StoreWriter's flush size


def _rows(n_trials: int, points: int, trial_ids: list[int]) -> list[dict[str, Any]]:
    return [
        {
            "trial_id": trial_ids[t],
            "step": 10 * s,
            "acc": s / points,
            "loss": 1.0 / s,
            "train_loss": 1.5 / s,
            "step_lr": 1e-3,
            "elapsed_s": 0.01 * s,
            "metrics": {"rebind_acc": 0.03},
        }
        for t in range(n_trials)
        for s in range(1, points + 1)
    ]


def ingest(url: str, n_rows: int = 200_000) -> dict[str, Any]:
    engine, _ = open_store_engine(url)
    n_trials = 1000
    points = max(1, n_rows // n_trials)
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, "bench", "name: bench", "h")
        ids = repo.add_trials(conn, sid, [(f"k{i}", {"arm": "a", "task": "t", "seed": i}) for i in range(n_trials)])
    rows = _rows(n_trials, points, [ids[f"k{i}"] for i in range(n_trials)])
    t0 = time.perf_counter()
    for i in range(0, len(rows), BATCH):
        with engine.begin() as conn:
            repo.upsert_evals(conn, rows[i : i + BATCH])
    dt = time.perf_counter() - t0
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT COUNT(*) FROM evals")).scalar_one()
        size = dialect.for_url(url).database_bytes(conn)
    engine.dispose()
    return {
        "rows": len(rows),
        "stored": stored,
        "seconds": dt,
        "rows_per_s": len(rows) / dt,
        # The whole database (1,000 trials' rows, indexes, schema) over its eval rows.
        "database_bytes": size,
        "bytes_per_row": size / max(stored, 1),
    }


def _train_once(params: dict[str, Any], engine=None, trial_id: int | None = None) -> float:
    from orchestrator.train import Trainer

    trainer = Trainer(params)
    buf: list[dict[str, Any]] = []
    last = time.monotonic()
    t0 = time.perf_counter()
    for point in trainer.run():
        if engine is not None:
            buf.append({"trial_id": trial_id, **point.to_dict()})
            if len(buf) >= BATCH or time.monotonic() - last >= 0.5:
                with engine.begin() as conn:
                    repo.upsert_evals(conn, buf)
                buf.clear()
                last = time.monotonic()
    if engine is not None and buf:
        with engine.begin() as conn:
            repo.upsert_evals(conn, buf)
    return time.perf_counter() - t0


def streaming_slowdown(steps: int = 300, repeats: int = 3) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    params = {
        "arm": "armed_gdn",
        "task": "mqar",
        "task.K": 16,
        "task.eval_size": 256,
        "d_model": 32,
        "n_layers": 1,
        "batch_size": 64,
        "steps": steps,
        "eval_every": 10,
        "lr": 3e-3,
    }
    with tempfile.TemporaryDirectory() as d:
        engine, _ = open_store_engine(f"sqlite:///{Path(d) / 's.db'}")
        with engine.begin() as conn:
            sid = repo.upsert_sweep(conn, "bench", "name: bench", "h")
            tid = repo.add_trials(conn, sid, [("k", params)])["k"]
        _train_once({**params, "steps": 20})  # warm-up
        plain, stream = [], []
        for _ in range(repeats):
            plain.append(_train_once(params))
            stream.append(_train_once(params, engine, tid))
        engine.dispose()
    p, s = statistics.median(plain), statistics.median(stream)
    return {
        "steps": steps,
        "eval_every": 10,
        "plain_s": p,
        "streaming_s": s,
        "slowdown_pct": 100.0 * (s - p) / p,
        "plain_runs": plain,
        "streaming_runs": stream,
    }


def sweep_efficiency(n_trials: int = 64, steps: int = 1000, cpus: int | None = None) -> dict[str, Any]:
    from orchestrator import spec as specs
    from orchestrator.runner.sweep import RunOptions, submit

    cpus = cpus or os.cpu_count() or 1
    text = f"""
name: bench_sweep
fixed: {{task: mqar, task.K: 8, task.eval_size: 128, d_model: 16, n_layers: 1,
         batch_size: 32, arm: armed_gdn, eval_every: 50, checkpoint_every_s: 30}}
axes: {{seed: 0..{n_trials - 1}}}
budget: {{steps: {steps}}}
resources: {{cpu: 1}}
max_concurrent: {cpus}
"""
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{Path(d) / 'sweep.db'}"
        sweep = specs.load(text=text)
        t0 = time.perf_counter()
        summary = submit(sweep, RunOptions(db=url, checkpoint_dir=str(Path(d) / "ck")))
        wall = time.perf_counter() - t0
        engine, _ = open_store_engine(url)
        with engine.connect() as conn:
            busy = conn.execute(
                sa.text(
                    "SELECT SUM(e.elapsed_s) FROM evals e JOIN trials t ON t.id = e.trial_id WHERE e.step = t.steps"
                )
            ).scalar_one()
        engine.dispose()
    slots = min(cpus, n_trials)
    return {
        "trials": n_trials,
        "steps_per_trial": steps,
        "slots": slots,
        "wall_s": wall,
        "training_s": busy,
        "mean_trial_s": busy / n_trials,
        "training_share": busy / (wall * slots),
        "outcomes": summary.outcomes,
    }
