"""Side-by-side speed of the operator implementations (forward + backward tokens/s).

Run ``python -m orchestrator.bench.chunk --help``. Implementations are timed in interleaved rounds
(naive, chunk, naive, chunk, ...) and the median per implementation is reported, because
step times on shared CPUs drift by +-10% or more between runs: only ratios measured in
one run are meaningful.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

import kernels
from kernels import testing


@dataclass(frozen=True)
class BenchRow:
    """One (operator, impl, shape) measurement; ``speedup`` is relative to naive in the same run."""

    op: str
    impl: str
    batch: int
    heads: int
    seq_len: int
    dim: int
    dtype: str
    threads: int
    chunk_size: int | None
    median_ms: float
    tokens_per_s: float
    speedup_vs_naive: float | None


def make_inputs(
    op: str, batch: int, heads: int, seq_len: int, dim: int, dtype: torch.dtype, device: str, seed: int = 0
) -> list[torch.Tensor | None]:
    """Positional inputs of ``op`` (``gated_delta_rule`` = delta_rule with alpha), requiring grad."""
    base = "delta_rule" if op == "gated_delta_rule" else op
    xs = testing.make_inputs(
        base, batch, heads, seq_len, dim, dtype=dtype, device=device, seed=seed, gated=op == "gated_delta_rule"
    )
    return [xs[name] for name in testing.ARG_NAMES[base]]


def _call(op: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    calls: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
        "delta_rule": kernels.delta_rule,
        "gated_delta_rule": kernels.delta_rule,
        "dplr_scan": kernels.dplr_scan,
        "ssd_scan": kernels.ssd_scan,
    }
    return calls[op]


def _step(op: str, inputs: list, impl: str, chunk_size: int | None, cotangents: dict) -> None:
    kwargs: dict[str, str | int] = {"impl": impl}
    if chunk_size is not None and impl == "chunk":
        kwargs["chunk_size"] = chunk_size
    out, state = _call(op)(*inputs, **kwargs)
    # Dense random cotangents, as a real loss gives. (``out.sum().backward()`` would hand the
    # backward stride-0 gradients, which send CPU bmm down a slow per-matrix path.)
    if not cotangents:
        g = torch.Generator().manual_seed(1)
        cotangents["out"] = torch.randn(out.shape, generator=g).to(out.device, out.dtype)
        cotangents["state"] = torch.randn(state.shape, generator=g).to(state.device, state.dtype)
    torch.autograd.backward([out, state], [cotangents["out"], cotangents["state"]])
    for x in inputs:
        if x is not None:
            x.grad = None


def bench(
    op: str,
    impls: list[str],
    batch: int,
    heads: int,
    seq_len: int,
    dim: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    threads: int | None = None,
    chunk_size: int | None = None,
    rounds: int = 7,
) -> list[BenchRow]:
    """Time fwd+bwd of ``op`` for each impl in interleaved rounds; return one row per impl."""
    if threads is not None:
        torch.set_num_threads(threads)
    inputs = make_inputs(op, batch, heads, seq_len, dim, dtype, device)
    times: dict[str, list[float]] = {impl: [] for impl in impls}
    cotangents: dict = {}
    for impl in impls:  # warm-up: first calls pay for allocation and lazy init
        _step(op, inputs, impl, chunk_size, cotangents)
    for _ in range(rounds):
        for impl in impls:
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            _step(op, inputs, impl, chunk_size, cotangents)
            if device == "cuda":
                torch.cuda.synchronize()
            times[impl].append(time.perf_counter() - t0)
    med = {impl: statistics.median(ts) for impl, ts in times.items()}
    rows = []
    for impl in impls:
        rows.append(
            BenchRow(
                op=op,
                impl=impl,
                batch=batch,
                heads=heads,
                seq_len=seq_len,
                dim=dim,
                dtype=str(dtype).replace("torch.", ""),
                threads=torch.get_num_threads(),
                chunk_size=chunk_size if impl == "chunk" else None,
                median_ms=med[impl] * 1e3,
                tokens_per_s=batch * seq_len / med[impl],
                speedup_vs_naive=med["naive"] / med[impl] if "naive" in med else None,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: prints one line (or JSON object) per measurement."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="delta_rule,gated_delta_rule,dplr_scan,ssd_scan")
    p.add_argument("--impls", default="naive,chunk")
    p.add_argument("--batch", type=int, nargs="+", default=[16])
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--seq-len", type=int, nargs="+", default=[256])
    p.add_argument("--dim", type=int, nargs="+", default=[32])
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--chunk-size", type=int, nargs="+", default=[0], help="0 = the operator's default")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    for threads in a.threads:
        for op in a.ops.split(","):
            for batch in a.batch:
                for seq_len in a.seq_len:
                    for dim in a.dim:
                        for cs in a.chunk_size:
                            rows = bench(
                                op,
                                a.impls.split(","),
                                batch,
                                a.heads,
                                seq_len,
                                dim,
                                dtype,
                                a.device,
                                threads,
                                cs or None,
                                a.rounds,
                            )
                            for r in rows:
                                if a.json:
                                    print(json.dumps(asdict(r)))
                                else:
                                    sp = f"{r.speedup_vs_naive:6.1f}x" if r.speedup_vs_naive else ""
                                    print(
                                        f"{r.op:17s} {r.impl:6s} B={r.batch:<3d} H={r.heads} T={r.seq_len:<4d} "
                                        f"D={r.dim:<3d} {r.dtype} thr={r.threads} C={r.chunk_size or '-':<3} "
                                        f"{r.median_ms:9.2f} ms {r.tokens_per_s:12.0f} tok/s {sp}"
                                    )


if __name__ == "__main__":
    main()
