"""`orchestrator bench pack`: trials/hour for 10 seeds of armed_gdn (d = 32, masked MQAR
K = 16), one trial per process vs one seed pack, side by side in one run.

Both arms get the same cores and one torch thread per process (two threads per process on a
shared 2-core machine oversubscribe it badly): the lone trials run as separate processes
(each spawned from scratch, as a trial runs in its own worker), as many at a time as there
are cores; the packed arm runs one pack per core, the seeds split evenly between them. Wall
time covers process start, model and data construction, training and evaluation.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any


# The trial the pack and store benchmarks time (each adds its own budget), so their figures
# are of one workload.
TRIAL: dict[str, Any] = {
    "arm": "armed_gdn",
    "task": "mqar",
    "task.K": 16,
    "task.eval_size": 256,
    "d_model": 32,
    "n_layers": 1,
    "batch_size": 64,
    "lr": 3e-3,
}


def params(seed: int, steps: int) -> dict[str, Any]:
    return {**TRIAL, "steps": steps, "eval_every": max(1, steps // 4), "seed": seed}


def _lone(args: tuple[int, int]) -> float:
    import torch

    torch.set_num_threads(1)
    from orchestrator.train import Trainer

    seed, steps = args
    trainer = Trainer(params(seed, steps), device="cpu")
    last = None
    for last in trainer.run():
        pass
    assert last is not None  # a run evaluates at least once
    return last.acc


def _pack(args: tuple[list[int], int]) -> list[float]:
    import torch

    seeds, steps = args
    torch.set_num_threads(1)
    from orchestrator.train.pack import PackTrainer

    pack = PackTrainer([params(s, steps) for s in seeds], device="cpu")
    for _ in pack.run():
        pass
    return [m.trace[-1].acc for m in pack.members]


def run(seeds: int = 10, steps: int = 200, cores: int | None = None) -> dict[str, Any]:
    if seeds < 2:
        raise ValueError(f"--seeds {seeds}: a seed pack needs at least 2 seeds")
    cores = cores or os.cpu_count() or 1
    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()
    with ctx.Pool(processes=cores, maxtasksperchild=1) as pool:
        lone_acc = pool.map(_lone, [(s, steps) for s in range(seeds)], chunksize=1)
    lone_s = time.perf_counter() - t0
    # One pack per core, but never a pack of one (a pack needs two members): with fewer than
    # two seeds per core, fewer, larger packs.
    n_packs = max(1, min(cores, seeds // 2))
    groups = [list(range(seeds))[i::n_packs] for i in range(n_packs)]
    t0 = time.perf_counter()
    with ctx.Pool(processes=len(groups)) as pool:
        parts = pool.map(_pack, [(g, steps) for g in groups], chunksize=1)
    pack_s = time.perf_counter() - t0
    pack_acc = [0.0] * seeds
    for g, accs in zip(groups, parts):
        for s, a in zip(g, accs):
            pack_acc[s] = a
    lone_tph = seeds / lone_s * 3600
    pack_tph = seeds / pack_s * 3600
    return {
        "seeds": seeds,
        "steps": steps,
        "cores": cores,
        "packs": len(groups),
        "lone_wall_s": lone_s,
        "pack_wall_s": pack_s,
        "lone_trials_per_hour": lone_tph,
        "pack_trials_per_hour": pack_tph,
        "speedup": pack_tph / lone_tph,
        "max_final_acc_diff": max(abs(a - b) for a, b in zip(lone_acc, pack_acc)),
    }
