"""`orchestrator bench pack`: trials/hour for 10 seeds of armed_gdn (d = 32, masked MQAR
K = 16), one trial per process vs one seed pack, side by side in one run.

Both arms get the same cores: the lone trials run as separate processes (spawned from
scratch, as a trial runs in its own worker), as many at a time as there are cores, one torch
thread each; the pack is one process with one torch thread per core. Wall time covers
process start, model and data construction, training and evaluation.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any


def params(seed: int, steps: int) -> dict[str, Any]:
    return {"arm": "armed_gdn", "task": "mqar", "task.K": 16, "task.eval_size": 256,
            "d_model": 32, "n_layers": 1, "batch_size": 64, "steps": steps,
            "eval_every": max(1, steps // 4), "lr": 3e-3, "seed": seed}


def _lone(args: tuple[int, int]) -> float:
    import torch

    torch.set_num_threads(1)
    from orchestrator.train import Trainer

    seed, steps = args
    trainer = Trainer(params(seed, steps), device="cpu")
    last = None
    for last in trainer.run():
        pass
    return last.acc


def _pack(args: tuple[int, int, int]) -> list[float]:
    import torch

    n, steps, threads = args
    torch.set_num_threads(threads)
    from orchestrator.train.pack import PackTrainer

    pack = PackTrainer([params(s, steps) for s in range(n)], device="cpu")
    for _ in pack.run():
        pass
    return [m.trace[-1].acc for m in pack.members]


def run(seeds: int = 10, steps: int = 200, cores: int | None = None) -> dict[str, Any]:
    cores = cores or os.cpu_count() or 1
    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()
    with ctx.Pool(processes=cores, maxtasksperchild=1) as pool:
        lone_acc = pool.map(_lone, [(s, steps) for s in range(seeds)], chunksize=1)
    lone_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ctx.Pool(processes=1) as pool:
        pack_acc = pool.apply(_pack, ((seeds, steps, cores),))
    pack_s = time.perf_counter() - t0
    lone_tph = seeds / lone_s * 3600
    pack_tph = seeds / pack_s * 3600
    return {"seeds": seeds, "steps": steps, "cores": cores, "lone_wall_s": lone_s,
            "pack_wall_s": pack_s, "lone_trials_per_hour": lone_tph,
            "pack_trials_per_hour": pack_tph, "speedup": pack_tph / lone_tph,
            "max_final_acc_diff": max(abs(a - b) for a, b in zip(lone_acc, pack_acc))}
