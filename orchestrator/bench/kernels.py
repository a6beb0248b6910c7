"""Forward+backward throughput of the naive, chunk and triton forms, side by side in one run.

Two settings per operator (gated delta rule, DPLR scan):

* ``small``: one application, B=8, H=2, T=256, head dim 32;
* ``paper``: the seed paper's d = 256 / 6 layers / ctx 512 configuration at operator level:
  six sequential applications (one per layer) of H = 4 heads of dim d/H = 64, B = 8.
  The paper's ~2,980 vs ~113 tok/s (GTX 1070) are whole-model training figures; these are
  the recurrence alone, so compare the *ratio*, not the absolute numbers.

Timing: one warm-up call per form (Triton compiles on first use), then interleaved rounds
(naive, chunk, triton, naive, ...) and the median per form, because shared machines drift
by 10% or more between runs. Tokens/s = B*T / (seconds for fwd+bwd of every layer).
On a CPU the paper setting times one of its six identical, independent layers and scales
by six (rows say so), and the naive loop gets fewer rounds, to stay near two minutes.
Triton is measured only on CUDA; elsewhere its rows say ``n/a`` (the interpreter is a
correctness tool, orders of magnitude slower than anything worth timing).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

OPS = ("delta_rule", "dplr_scan")
IMPLS = ("naive", "chunk", "triton")


@dataclass(frozen=True)
class BenchConfig:
    """One setting: ``layers`` sequential applications of (B, H, T, dim) per fwd+bwd."""

    name: str
    batch: int
    heads: int
    seq_len: int
    dim: int
    layers: int
    rounds: int
    # A CPU budget of ~2 minutes: the naive loop at ctx 512 costs seconds per layer, so on a
    # CPU fewer naive rounds run and only ``cpu_layers`` of the identical, independent layers
    # are timed, then scaled by layers / cpu_layers (exact for independent equal layers).
    naive_rounds_cpu: int
    cpu_layers: int


CONFIGS = (
    BenchConfig("small_B8_H2_T256_D32", 8, 2, 256, 32, 1, rounds=5, naive_rounds_cpu=2, cpu_layers=1),
    BenchConfig("paper_d256_L6_ctx512", 8, 4, 512, 64, 6, rounds=3, naive_rounds_cpu=1, cpu_layers=1),
)
QUICK_CONFIGS = (  # seconds on a CPU: for tests of the command itself
    BenchConfig("quick_B2_H1_T16_D8", 2, 1, 16, 8, 1, rounds=1, naive_rounds_cpu=1, cpu_layers=1),
    BenchConfig("quick_L2_B1_H2_T24_D4", 1, 2, 24, 4, 2, rounds=1, naive_rounds_cpu=1, cpu_layers=2),
)


def make_layer_inputs(op: str, cfg: BenchConfig, device: str, seed: int = 0) -> list[list[torch.Tensor]]:
    """Per layer, the operator's inputs (fp32, requiring grad) with the cells' usual ranges:
    unit-norm keys, write/removal rates in (0, 1), decays in (0.5, 1)."""
    g = torch.Generator().manual_seed(seed)
    shape = (cfg.batch, cfg.heads, cfg.seq_len, cfg.dim)

    def rnd(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g)

    def unif(lo: float, *s: int) -> torch.Tensor:
        return lo + (1 - lo) * torch.rand(*s, generator=g)

    layers = []
    for _ in range(cfg.layers):
        if op == "delta_rule":
            xs = [
                rnd(*shape),
                F.normalize(rnd(*shape), dim=-1),
                rnd(*shape),
                unif(0.0, *shape[:3]),
                unif(0.5, *shape[:3]),
            ]
        else:
            xs = [
                rnd(*shape),
                rnd(*shape) / cfg.dim**0.5,
                rnd(*shape),
                unif(0.5, *shape),
                F.normalize(rnd(*shape), dim=-1),
                unif(0.0, *shape),
            ]
        layers.append([x.to(device).requires_grad_() for x in xs])
    return layers


def _fwd_bwd(op: str, impl: str, layers: list[list[torch.Tensor]]) -> None:
    import kernels

    fn = kernels.delta_rule if op == "delta_rule" else kernels.dplr_scan
    loss: torch.Tensor | float = 0.0
    for xs in layers:
        o, state = fn(*xs, impl=impl)
        loss = loss + o.sum() + state.sum()
    assert isinstance(loss, torch.Tensor)  # one layer at least
    loss.backward()
    for xs in layers:
        for x in xs:
            x.grad = None


def _timed(op: str, impl: str, layers, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    _fwd_bwd(op, impl, layers)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def triton_status(op: str, device: str) -> str | None:
    """None when the triton form can be timed here, else why not."""
    if device != "cuda":
        return "n/a: needs CUDA"
    from kernels.dispatch import triton_function

    fn, why = triton_function(op)
    return None if fn is not None else f"n/a: {why}"


def run_benchmark(device: str, quick: bool = False, log=None) -> dict:
    """Measure every (op, config, impl); returns ``{"device", "rows", "speedup"}``.

    ``rows``: ``{"op", "config", "impl", "tok_s", "ms", "note"}`` with ``tok_s`` None where a
    form was not measured. ``speedup["<op>/<config>"]``: ``chunk_vs_naive``,
    ``triton_vs_naive``, ``triton_vs_chunk`` (None when a side is missing).
    """
    rows, speedup = [], {}
    for cfg in QUICK_CONFIGS if quick else CONFIGS:
        for op in OPS:
            skip = {"triton": triton_status(op, device)}
            impls = [i for i in IMPLS if skip.get(i) is None]
            timed_layers = cfg.layers if device == "cuda" else cfg.cpu_layers
            layers = make_layer_inputs(op, cfg, device)[:timed_layers]
            scale = cfg.layers / timed_layers
            times: dict[str, list[float]] = {i: [] for i in impls}
            for impl in impls:
                if not (impl == "naive" and device == "cpu"):  # nothing to warm in a Python loop
                    _timed(op, impl, layers, device)  # warm-up (Triton compiles here)
            for r in range(cfg.rounds):
                for impl in impls:
                    if impl == "naive" and device == "cpu" and r >= cfg.naive_rounds_cpu:
                        continue
                    times[impl].append(_timed(op, impl, layers, device) * scale)
            med = {i: statistics.median(ts) for i, ts in times.items()}
            tokens = cfg.batch * cfg.seq_len
            for impl in IMPLS:
                sec = med.get(impl)
                note = skip.get(impl) or f"median of {len(times[impl])}"
                if sec is not None and timed_layers < cfg.layers:
                    note += f"; {timed_layers} of {cfg.layers} layers timed, x{scale:g}"
                rows.append(
                    {
                        "op": op,
                        "config": cfg.name,
                        "impl": impl,
                        "tok_s": None if sec is None else tokens / sec,
                        "ms": None if sec is None else sec * 1e3,
                        "note": note,
                    }
                )
                if log is not None:
                    log(rows[-1])

            def ratio(a: str, b: str) -> float | None:
                return med[b] / med[a] if a in med and b in med else None  # noqa: B023 - called at once, inside the loop

            speedup[f"{op}/{cfg.name}"] = {
                "chunk_vs_naive": ratio("chunk", "naive"),
                "triton_vs_naive": ratio("triton", "naive"),
                "triton_vs_chunk": ratio("triton", "chunk"),
            }
    return {"device": _device_name(device), "rows": rows, "speedup": speedup}


def _device_name(device: str) -> str:
    if device == "cuda":
        return f"cuda: {torch.cuda.get_device_name()}"
    return f"cpu: {torch.get_num_threads()} threads"


if __name__ == "__main__":  # fallback entry when the orchestrator CLI cannot import (bare GPU image)
    import argparse
    import json

    p = argparse.ArgumentParser(description="naive vs chunk vs triton throughput (JSON)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    print(json.dumps(run_benchmark(a.device, quick=a.quick), indent=2))
