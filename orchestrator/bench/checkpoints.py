"""`orchestrator bench checkpoints`: what storing checkpoints in the database costs.

1. Sizes: a checkpoint (``Trainer.state_dict`` as ``torch.save`` bytes: model, Adam state,
   RNG states and the trace) of the first trial of each named spec, after one step and at its
   last (the trace holds every eval point by then).
2. Database growth of a whole sweep: trials x (last checkpoint + eval rows x bytes per row),
   bytes per row measured by ingesting rows into a fresh SQLite file.
3. Streaming slowdown: one quickstart-shaped trial trained side by side (interleaved
   repeats, medians) streaming its eval rows with checkpoints kept as files (the pre-0007
   way) and with checkpoints stored in the same transaction as the rows, in the training
   process itself (an upper bound, as `bench store`'s streaming figure: in a sweep the
   writer runs in the driver), at the quickstart's cadence and at every eval.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from orchestrator.runner import checkpoints
from orchestrator.store import attempts, repo
from orchestrator.store.engine import open_store_engine

QUICKSTART = "sweeps/quickstart.yaml"


def _spec_path(path: str) -> str:
    """``sweeps/...`` from the working directory, else from the checkout this runs from."""
    if Path(path).exists():
        return path
    beside = Path(__file__).resolve().parents[2] / path
    return str(beside) if beside.exists() else path


def sizes(spec_path: str) -> dict[str, Any]:
    """Checkpoint bytes of the spec's first trial after one step and at its end (the trace
    then holds every eval point)."""
    import torch

    from orchestrator import spec as specs
    from orchestrator.train import Trainer

    torch.set_num_threads(1)
    sweep = specs.load(_spec_path(spec_path), max_trials=10**7)
    key, params = sweep.trials[0]
    evals = int(params["steps"]) // int(params["eval_every"]) + 1
    # One step is enough: the optimizer's state has its full size after the first.
    trainer = Trainer({**params, "steps": 1, "eval_every": 1})
    for _ in trainer.run():
        pass
    state = trainer.state_dict()
    first = len(checkpoints.serialize(state))
    last = len(checkpoints.serialize({**state, "trace": state["trace"][-1:] * evals}))
    return {
        "spec": spec_path,
        "trials": len(sweep.trials),
        "arm": params.get("arm"),
        "d_model": params.get("d_model"),
        "evals_per_trial": evals,
        "first_bytes": first,
        "last_bytes": last,
    }


def bytes_per_eval_row(rows: int = 20_000) -> float:
    """File bytes per stored eval row in a fresh SQLite database (pages, index and all)."""
    from orchestrator.bench.store import ingest

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "rows.db"
        url = f"sqlite:///{path}"
        open_store_engine(url)[0].dispose()
        empty = path.stat().st_size
        ingest(url, rows)
        return (path.stat().st_size - empty) / rows


def _train(params: dict[str, Any], engine, tid: int, mode: str, folder: Path) -> float:
    """One trial streaming rows as the writer does (every 0.5 s), checkpoints by ``mode``."""
    from orchestrator.train import Trainer

    trainer = Trainer(params)
    rows: list[dict[str, Any]] = []
    ckpt: attempts.StoredCheckpoint | None = None
    every = trainer.p.checkpoint_every_s
    last_flush = last_save = time.monotonic()
    t0 = time.perf_counter()

    def flush() -> None:
        nonlocal ckpt
        with engine.begin() as conn:
            repo.upsert_evals(conn, rows)
            if mode == "database" and ckpt is not None:
                attempts.save_checkpoints(conn, [ckpt])
        if mode == "file" and ckpt is not None:
            checkpoints.save(folder / "trial.pt", ckpt.state)
        rows.clear()
        ckpt = None

    for point in trainer.run():
        rows.append({"trial_id": tid, **point.to_dict()})
        if point.step == trainer.p.steps or time.monotonic() - last_save >= every:
            state = trainer.state_dict()
            ckpt = attempts.StoredCheckpoint(tid, int(state["step"]), checkpoints.serialize(state))
            last_save = time.monotonic()
        if time.monotonic() - last_flush >= 0.5:
            flush()
            last_flush = time.monotonic()
    flush()
    return time.perf_counter() - t0


def streaming(url: str, steps: int = 600, repeats: int = 3, every_s: float | None = None) -> dict[str, Any]:
    """File vs database checkpoints for the quickstart's trial (d 32, eval every 100), side by
    side; ``every_s`` overrides its checkpoint cadence (default 30 s: the quickstart's)."""
    import torch

    from orchestrator import spec as specs

    torch.set_num_threads(1)
    _, params = specs.load(_spec_path(QUICKSTART)).trials[0]
    params = {**params, "steps": steps}
    if every_s is not None:
        params["checkpoint_every_s"] = every_s
    engine, _ = open_store_engine(url)
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, "bench_ckpt", "name: bench_ckpt", "h")
        tid = repo.add_trials(conn, sid, [("k", params)])["k"]
    runs: dict[str, list[float]] = {"file": [], "database": []}
    with tempfile.TemporaryDirectory() as d:
        _train({**params, "steps": min(steps, 100)}, engine, tid, "file", Path(d))  # warm-up
        for i in range(repeats):
            order = ("file", "database") if i % 2 == 0 else ("database", "file")
            for mode in order:
                runs[mode].append(_train(params, engine, tid, mode, Path(d)))
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT nbytes FROM trial_checkpoints")).scalar()
    engine.dispose()
    f, db = statistics.median(runs["file"]), statistics.median(runs["database"])
    return {
        "steps": steps,
        "checkpoint_every_s": params.get("checkpoint_every_s", 30.0),
        "file_s": f,
        "database_s": db,
        "slowdown_pct": 100.0 * (db - f) / f,
        "file_runs": runs["file"],
        "database_runs": runs["database"],
        "checkpoint_bytes": stored,
    }


def store_cost(url: str | None, nbytes: int, repeats: int = 30) -> dict[str, float]:
    """Median milliseconds to store one checkpoint of ``nbytes`` in its own transaction in the
    database at ``url``, and (``url`` None) to write it as a file atomically: what the
    driver's writer spends per checkpoint, off the training path."""
    import os

    blob = os.urandom(nbytes)
    times: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        if url is None:
            for _ in range(repeats):
                t0 = time.perf_counter()
                checkpoints.save(Path(d) / "ck" / "trial.pt", blob)
                times.append(time.perf_counter() - t0)
        else:
            engine, _ = open_store_engine(url)
            with engine.begin() as conn:
                sid = repo.upsert_sweep(conn, "bench_ckpt_store", "name: bench_ckpt_store", "h")
                tid = repo.add_trials(conn, sid, [("k", {"arm": "a", "seed": 0})])["k"]
            for i in range(repeats):
                t0 = time.perf_counter()
                with engine.begin() as conn:
                    attempts.save_checkpoints(conn, [attempts.StoredCheckpoint(tid, i, blob)])
                times.append(time.perf_counter() - t0)
            engine.dispose()
    return {"bytes": nbytes, "ms": 1e3 * statistics.median(times)}
