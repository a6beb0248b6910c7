"""The scaffold study's training step on the lent device (part of tests/gpu/check.sh).

Times one mLSTM training step (forward + backward + AdamW) at the basin map's size (d 94,
4 heads, T 768, batch 16, vocab 96: ``sweeps/basin_map.yaml``) for each read (raw, ns5) and
precision (fp32; bf16 autocast where the GPU has it), the peak device memory of a step, and
one held-out evaluation pass (``eval_size`` sequences in batches of 256, no gradients). From
those it projects the basin map's wall time on one such GPU: per trial ``steps * step +
evals * eval``, summed over the 72 trials of each read, one trial at a time and without seed
packing (the spec packs seeds and runs 4 trials per GPU, so this is an upper bound).

Tokens are uniform random and every position is scored: the step's cost does not depend
on what the tokens say, and MAD recall scores a subset of positions, so the readout and
loss here are, if anything, slightly dearer than in the study. Only ``torch`` and ``cells``
are imported (a bare GPU image has no pydantic, so ``tasks`` and the training loop are not
used). Prints one JSON object; ``--out`` also writes it.

    python tests/gpu/study_step.py [--device cuda] [--out FILE]
    python tests/gpu/study_step.py --device cpu --d-model 16 --heads 2 --seq-len 32 --batch 2 --timed 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cells.registry import build  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device, bf16: bool):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)


def measure(read: str, bf16: bool, a: argparse.Namespace, device: torch.device) -> dict:
    """Median step and eval-pass milliseconds and the step's peak memory for one read and precision."""
    torch.manual_seed(0)
    model = build("mlstm", a.vocab, d_model=a.d_model, heads=a.heads, read=read).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=gen).to(device)
    targets = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=gen).to(device)

    def step() -> float:
        _sync(device)
        start = time.perf_counter()
        with _autocast(device, bf16):
            logits = model(tokens)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        _sync(device)
        if not torch.isfinite(loss):
            raise RuntimeError(f"read {read}: non-finite loss")
        return time.perf_counter() - start

    for _ in range(a.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    steps = [step() for _ in range(a.timed)]
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None

    eval_batch = min(256, a.eval_size)
    eval_tokens = torch.randint(0, a.vocab, (eval_batch, a.seq_len), generator=gen).to(device)

    @torch.no_grad()
    def eval_pass() -> float:
        _sync(device)
        start = time.perf_counter()
        for _ in range(-(-a.eval_size // eval_batch)):
            with _autocast(device, bf16):
                model(eval_tokens)
        _sync(device)
        return time.perf_counter() - start

    eval_pass()
    evals = [eval_pass() for _ in range(max(1, a.timed // 5))]
    return {
        "read": read,
        "precision": "bf16" if bf16 else "fp32",
        "step_ms": 1e3 * statistics.median(steps),
        "eval_ms": 1e3 * statistics.median(evals),
        "peak_mib": peak,
    }


def project(row: dict, a: argparse.Namespace) -> float:
    """Hours for ``a.trials_per_read`` trials of this read, one at a time."""
    n_evals = 2 + (a.budget - 1) // a.eval_every  # step 1, every eval_every, and the last
    per_trial_s = (a.budget * row["step_ms"] + n_evals * row["eval_ms"]) / 1e3
    return a.trials_per_read * per_trial_s / 3600


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--reads", default="raw,ns5")
    p.add_argument("--d-model", type=int, default=94)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=768)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--eval-size", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timed", type=int, default=10)
    p.add_argument("--budget", type=int, default=3000, help="steps per trial (basin_map: 3000)")
    p.add_argument("--eval-every", type=int, default=200, help="basin_map: 200")
    p.add_argument("--trials-per-read", type=int, default=72, help="basin_map: 3 lr x 3 vocab x 8 seeds")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    device = torch.device(a.device)
    bf16_ok = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8
    rows = []
    for read in a.reads.split(","):
        for bf16 in (False, True) if bf16_ok else (False,):
            row = measure(read, bf16, a, device)
            row["basin_map_hours_one_at_a_time"] = project(row, a)
            rows.append(row)
    hours = {}
    for prec in sorted({r["precision"] for r in rows}):
        hours[prec] = sum(r["basin_map_hours_one_at_a_time"] for r in rows if r["precision"] == prec)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "size": {k: getattr(a, k) for k in ("d_model", "heads", "seq_len", "batch", "vocab")},
        "rows": rows,
        "basin_map_hours_one_gpu_unpacked": hours,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
