"""``orchestrator bench kernels [--json] [--device cpu|cuda] [--quick]``: scan throughput."""

from __future__ import annotations

import json

import typer

from orchestrator.cli.app import bench_app
from orchestrator.errors import UserError


def _fmt(x: float | None, spec: str, width: int = 0, unit: str = "") -> str:
    return ("n/a" if x is None else format(x, spec) + unit).rjust(width)


@bench_app.command("kernels")
def bench_kernels(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    device: str = typer.Option("", "--device", help="cpu or cuda (default: cuda when present, else cpu)."),
    quick: bool = typer.Option(False, "--quick", help="Tiny shapes, one round: checks the command, not speed."),
) -> None:
    """Tokens/s fwd+bwd of the delta rule and DPLR scan: naive vs chunk vs triton, side by side.

    Settings: B=8,H=2,T=256,D=32, and the paper's d=256 / 6 layers / ctx 512 at operator
    level (6 sequential applications, 4 heads of dim 64). Triton is timed on CUDA only.
    """
    import torch

    from orchestrator.bench.kernels import run_benchmark

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible to torch here; use --device cpu")

    def log(row: dict) -> None:
        if not json_out:
            typer.echo(
                f"{row['op']:<11} {row['config']:<24} {row['impl']:<7} "
                f"{_fmt(row['tok_s'], ',.0f', 12)} tok/s {_fmt(row['ms'], '.1f', 10)} ms  ({row['note']})"
            )

    result = run_benchmark(device, quick=quick, log=log)
    if json_out:
        typer.echo(json.dumps(result, indent=2))
        return
    typer.echo(f"device: {result['device']}")
    for key, sp in result["speedup"].items():
        parts = [f"{name.replace('_vs_', ' vs ')} {_fmt(val, '.1f', unit='x')}" for name, val in sp.items()]
        typer.echo(f"speedup {key}: " + ", ".join(parts))
