"""``orchestrator bench tasks``: batch generation time vs one training step of the default
cell (armed_gdn, d_model=32, 1 layer) at each task's published settings.

Generation and the step are timed in interleaved rounds (machine drift hits both alike);
each figure is the median over rounds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import cells
import tasks
from orchestrator.train.loop import train_step
from tasks.published import PUBLISHED

# Settings whose readout (B x L x V logits) is far outside the default cell's regime get a
# generation figure only.
STEP_LIMIT_TOKENS_X_VOCAB = 2_000_000_000
GEN_BLOCK = 10


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _make_step(task: Any, batch: int, gen: Any, device: str) -> Callable[[], None]:
    torch.manual_seed(0)
    model = cells.build("armed_gdn", vocab_size=task.vocab_size, d_model=32, n_layers=1).to(device)
    opt = torch.optim.AdamW(model.parameters())
    x, y = task.train_batch(batch, gen)
    dev = torch.device(device)

    def step() -> None:
        # The training loop's own step (fp32, no clipping), on a fixed batch.
        train_step(model, opt, x, y, device=dev, bf16=False, grad_clip=None)

    for _ in range(3):  # the first steps pay for allocator and kernel-selection warm-up
        step()
    return step


def run_bench(names: Sequence[str], batch: int, reps: int, device: str) -> list[dict[str, Any]]:
    """One row per published setting of the tasks in ``names``."""
    rows = []
    for name, params in PUBLISHED:
        if name not in names:
            continue
        task = tasks.build(name, **params)
        gen = tasks.train_generator(0, device)
        state = None
        cur = task.curriculum(1000)
        if cur is not None:
            state = cur.state()
        task.train_batch(batch, gen, state)  # warm-up (lazy tables, allocator)
        do_step = batch * task.seq_len * task.vocab_size <= STEP_LIMIT_TOKENS_X_VOCAB
        step_fn = _make_step(task, batch, gen, device) if do_step else None
        gen_s, step_s = [], []
        for _ in range(reps):
            # Generation is ~1000x cheaper than a step: average a block of batches per round.
            t0 = time.perf_counter()
            for _ in range(GEN_BLOCK):
                task.train_batch(batch, gen, state)
            _sync(device)
            gen_s.append((time.perf_counter() - t0) / GEN_BLOCK)
            if step_fn is not None:
                t0 = time.perf_counter()
                step_fn()
                _sync(device)
                step_s.append(time.perf_counter() - t0)
        g = statistics.median(gen_s) * 1e3
        s = statistics.median(step_s) * 1e3 if step_s else None
        rows.append(
            {
                "task": name,
                "params": params,
                "batch": batch,
                "seq_len": task.seq_len,
                "vocab_size": task.vocab_size,
                "gen_ms": round(g, 4),
                "step_ms": None if s is None else round(s, 3),
                "gen_pct_of_step": None if s is None else round(100 * g / s, 3),
            }
        )
    return rows
