"""Short fp32 and bf16 training runs through the scan kernels (part of tests/gpu/check.sh).

For each arm (armed_gdn: delta rule; armed_dg_rank: DPLR scan), ``cells.build`` + AdamW
for ``--steps`` steps on a learnable synthetic task (predict the token ``--lag`` positions
back, which needs the recurrence), run three ways from the same seed:

* fp32 with ``impl`` (triton on CUDA) and fp32 with ``impl=chunk``: the loss traces must
  agree (``max_rel_diff``), an end-to-end check of forward and backward through training;
* bf16 autocast with ``impl``: finite, and the loss must fall (mean of the last fifth of
  the steps below the mean of the first fifth).

Where ``cells`` cannot be imported (a bare GPU image may lack its dependencies), a small
model written here around ``kernels.delta_rule``/``kernels.dplr_scan`` stands in, and the
output says so. Prints one JSON object; exit status 1 if a check failed.

    python tests/gpu/train_smoke.py [--device cuda] [--impl triton] [--steps 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kernels  # noqa: E402

ARMS = {"armed_gdn": "delta_rule", "armed_dg_rank": "dplr_scan"}


class TinyScanModel(nn.Module):
    """Fallback model: embedding, one scan mixer (projections + operator), readout."""

    def __init__(self, op: str, vocab: int, d: int, impl: str) -> None:
        super().__init__()
        self.op, self.impl = op, impl
        self.emb = nn.Embedding(vocab, d)
        n_proj = 4 if op == "delta_rule" else 6
        self.proj = nn.Linear(d, n_proj * d)
        self.out = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        d = h.shape[-1]
        parts = self.proj(h).unsqueeze(1).split(d, dim=-1)  # each (B, 1, T, d)
        if self.op == "delta_rule":
            q, k, v, g = parts
            beta = torch.sigmoid(g[..., 0])
            alpha = torch.sigmoid(g[..., 1] + 3.0)
            o, _ = kernels.delta_rule(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, beta, alpha, impl=self.impl)
        else:
            r, k, v, w, kap, a = parts
            o, _ = kernels.dplr_scan(
                r, k, v, torch.sigmoid(w + 3.0), F.normalize(kap, dim=-1), torch.sigmoid(a), impl=self.impl
            )
        return self.head(h + self.out(o.squeeze(1)))


def build_model(arm: str, vocab: int, d: int, impl: str) -> tuple[nn.Module, str]:
    try:
        import cells

        return cells.build(arm, vocab, d_model=d, n_layers=1, impl=impl), "cells.build"
    except ImportError as exc:
        return TinyScanModel(ARMS[arm], vocab, d, impl), f"fallback TinyScanModel (cells: {exc})"


def batch(step: int, bsz: int, seq: int, vocab: int, lag: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randint(0, vocab, (bsz, seq), generator=g)
    y = torch.full_like(x, -100)
    y[:, lag:] = x[:, :-lag]
    return x.to(device), y.to(device)


def train(arm: str, impl: str, precision: str, args) -> dict:
    torch.manual_seed(0)
    model, source = build_model(arm, args.vocab, args.d_model, impl)
    model = model.to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, y = batch(step, args.batch, args.seq_len, args.vocab, args.lag, args.device)
        with torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), y.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    if args.device == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    # Means over the first and last fifth: single-batch losses are noisy.
    win = max(1, len(losses) // 5)
    return {
        "arm": arm,
        "impl": impl,
        "precision": precision,
        "model": source,
        "first_loss": sum(losses[:win]) / win,
        "last_loss": sum(losses[-win:]) / win,
        "losses": losses,
        "ms_per_step": 1e3 * secs / args.steps,
        "finite": all(math.isfinite(v) for v in losses),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--impl", default="triton")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--lag", type=int, default=3)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--trace-tol", type=float, default=2e-3, help="max relative loss difference, impl vs chunk")
    p.add_argument("--out", default="")
    args = p.parse_args()

    runs, checks = [], {}
    for arm in ARMS:
        fp32 = train(arm, args.impl, "fp32", args)
        ref = train(arm, "chunk", "fp32", args)
        bf16 = train(arm, args.impl, "bf16", args)
        runs += [fp32, ref, bf16]
        diff = max(abs(a - b) / max(abs(b), 1e-8) for a, b in zip(fp32["losses"], ref["losses"]))
        checks[arm] = {
            "fp32_trace_max_rel_diff_vs_chunk": diff,
            "fp32_matches_chunk": diff < args.trace_tol,
            "fp32_loss_falls": fp32["last_loss"] < fp32["first_loss"],
            "bf16_finite": bf16["finite"],
            "bf16_loss_falls": bf16["last_loss"] < bf16["first_loss"],
        }
    ok = all(v for c in checks.values() for k, v in c.items() if isinstance(v, bool))
    result = {
        "device": args.device,
        "impl": args.impl,
        "steps": args.steps,
        "ok": ok,
        "checks": checks,
        "runs": [{k: v for k, v in r.items() if k != "losses"} for r in runs],
        "traces": {f"{r['arm']}/{r['impl']}/{r['precision']}": r["losses"] for r in runs},
    }
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    print(json.dumps({k: v for k, v in result.items() if k != "traces"}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
