"""``orchestrator cells`` (the arm table) and ``orchestrator bench cells`` (naive vs default speed)."""

from __future__ import annotations

import json
from typing import Any, Optional

import typer
import yaml

from orchestrator.cli.app import app, bench_app, console
from orchestrator.errors import UserError

MAMBA2_ARMS = ("mamba2_ref", "mamba2_ref_noconv")


def _split_arms(values: Optional[list[str]], known: tuple[str, ...]) -> list[str]:
    """Arms from repeated and/or comma-separated options; all of ``known`` when none given."""
    if not values:
        return list(known)
    arms = [a.strip() for v in values for a in v.split(",") if a.strip()]
    import cells

    for label in arms:
        arm = label.split(":", 1)[0]  # ARM:key=value variants (cells.bench.parse_variant)
        if arm not in cells.ARMS:
            raise UserError(f"unknown arm {arm!r} (known: {', '.join(cells.ARMS)})")
        if arm not in known:
            raise UserError(f"arm {arm!r} has no naive form to compare (benchable: {', '.join(known)})")
    return arms


def _parse_knobs(values: Optional[list[str]]) -> dict[str, Any]:
    """``key=value`` pairs; values are read as YAML scalars (``4``, ``true``, ``ns5``, ``null``)."""
    out: dict[str, Any] = {}
    for item in values or []:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"--knob expects key=value, got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            raise UserError(f"--knob {item!r}: value is not a YAML scalar") from None
    return out


def _format_knobs(k: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in k.items())


@app.command("cells")
def cells_cmd(
    d_model: int = typer.Option(32, "--d-model", help="model width for every arm (32 = the factorial)"),
    n_layers: int = typer.Option(1, "--n-layers", help="layers for every arm"),
    mamba2_d_state: int = typer.Option(16, "--mamba2-d-state", help="d_state of the mamba2_ref arms"),
    vocab_size: int = typer.Option(
        91, "--vocab-size", help="vocabulary (91 = masked MQAR: 64 keys + 26 values + mask)"
    ),
    arms: Optional[list[str]] = typer.Option(None, "--arms", "--arm", help="arms to list (repeat or comma-separate)"),
    knob: Optional[list[str]] = typer.Option(
        None, "--knob", help="key=value applied to every listed arm that has that knob (repeatable)"
    ),
    json_out: bool = typer.Option(False, "--json", help="print a JSON list of rows"),
    spec: Optional[str] = typer.Option(
        None,
        "--spec",
        help="list the arms of this sweep spec as its trials build them "
        "(with match_params: the MLP width chosen per arm)",
    ),
) -> None:
    """One row per arm: parameters, recurrent state per layer, and the knobs it carries."""
    import cells

    from orchestrator.plugins import load_installed

    load_installed()  # plugin arms (entry points, $ORCH_PLUGINS) list like built-in ones
    if spec is not None:
        _spec_rows(spec, json_out)
        return

    selected = _split_arms(arms, cells.ARMS) if arms else list(cells.ARMS)
    overrides = _parse_knobs(knob)
    used: set[str] = set()
    rows = []
    for arm in selected:
        accepted = cells.knobs(arm)
        given = {k: v for k, v in overrides.items() if k in accepted}
        used.update(given)
        if arm in MAMBA2_ARMS:
            given.setdefault("d_state", mamba2_d_state)
        try:
            rows.append(cells.describe(arm, vocab_size, d_model=d_model, n_layers=n_layers, **given))
        except ValueError as exc:
            raise UserError(str(exc)) from None
    unused = sorted(set(overrides) - used)
    if unused:
        raise UserError(f"knob {unused[0]!r} is not a knob of any listed arm ({', '.join(selected)})")
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"arms at d_model={d_model}, n_layers={n_layers}, vocab_size={vocab_size}")
    for col in ("arm", "params", "state/layer", "knobs"):
        table.add_column(col, justify="right" if col in ("params", "state/layer") else "left")
    for row in rows:
        state = f"{row['state_elements']:,}" + (" /token" if row["state_scaling"] == "per_token" else "")
        table.add_row(row["arm"], f"{row['params']:,}", state, _format_knobs(row["knobs"]))
    console(width=200, highlight=True).print(table)


def _spec_rows(path: str, json_out: bool) -> None:
    from orchestrator.design.matching import unmatched
    from orchestrator.params import split
    from orchestrator.spec import load

    sweep = load(path)
    rows = list(sweep.matched)
    if not rows:  # no match_params: each distinct model of the spec, as built
        import tasks

        seen: set[tuple] = set()
        for _, params in sweep.trials:
            top, knobs, task_params, _ = split(params)
            vocab = tasks.build(top["task"], **task_params).vocab_size
            sig = (top["arm"], top["d_model"], top["n_layers"], vocab, tuple(sorted(knobs.items())))
            if sig not in seen:
                seen.add(sig)
                # By keyword: the signature's order (arm, vocab, d_model, ...) is not this tuple's.
                row = unmatched(
                    arm=top["arm"],
                    vocab=vocab,
                    d_model=top["d_model"],
                    n_layers=top["n_layers"],
                    knobs=tuple(sorted(knobs.items())),
                )
                rows.append({**row, "knobs": dict(knobs)})
    if json_out:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    from rich.table import Table

    table = Table(title=f"arms of {path}")
    for col in ("arm", "params", "state/layer", "mlp_hidden", "knobs"):
        table.add_column(col, justify="left" if col in ("arm", "knobs") else "right")
    for r in rows:
        state = f"{r['state_elements']:,}" + (" /token" if r["state_scaling"] == "per_token" else "")
        table.add_row(
            r["arm"],
            f"{r['params']:,}",
            state,
            "-" if r["mlp_hidden"] is None else str(r["mlp_hidden"]),
            _format_knobs(r["knobs"]),
        )
    console(width=200, highlight=True).print(table)


@bench_app.command("cells")
def bench_cells_cmd(
    arms: Optional[list[str]] = typer.Option(None, "--arms", "--arm", help="arms to time (repeat or comma-separate)"),
    seq_len: int = typer.Option(256, "--seq-len", min=1, help="tokens per sequence"),
    d_model: int = typer.Option(32, "--d-model", min=1, help="model width"),
    n_layers: int = typer.Option(1, "--n-layers", min=1, help="layers"),
    batch: int = typer.Option(8, "--batch", min=1, help="sequences per batch"),
    vocab_size: int = typer.Option(91, "--vocab-size", min=2, help="vocabulary size"),
    repeats: int = typer.Option(5, "--repeats", min=1, help="interleaved timed rounds (median taken)"),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, or cuda:N"),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="torch CPU threads (default: torch's)"),
    clock: str = typer.Option(
        "wall", "--clock", help="wall, or cpu: this thread's CPU time (with --threads 1; steadier on a shared machine)"
    ),
    json_out: bool = typer.Option(False, "--json", help='print {"rows": [...]} as JSON'),
) -> None:
    """Forward+backward tokens/s per arm: naive recurrence vs the default path, in one run."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)

    from orchestrator.bench.cells import bench_arms, run_bench

    selected = _split_arms(arms, bench_arms())
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"--device expects cpu, cuda or cuda:N, got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda requested but CUDA is not available here")
    # The run's settings, named once: given to the benchmark and echoed in its JSON.
    settings = {"seq_len": seq_len, "d_model": d_model, "n_layers": n_layers, "batch": batch, "repeats": repeats}
    try:
        rows = run_bench(selected, **settings, vocab_size=vocab_size, device=dev, clock=clock)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if json_out:
        typer.echo(
            json.dumps(
                {
                    "rows": rows,
                    **settings,
                    "device": str(dev),
                    "threads": torch.get_num_threads(),
                    "clock": clock,
                },
                indent=2,
            )
        )
        return
    from rich.table import Table

    table = Table(
        title=f"fwd+bwd tokens/s, T={seq_len}, d={d_model}, batch={batch}, {dev}, "
        f"{torch.get_num_threads()} threads, median of {repeats} interleaved rounds, {clock} clock"
    )
    for col in ("arm", "naive tok/s", "default tok/s", "speedup", "harness tok/s", "ceiling"):
        table.add_column(col, justify="left" if col == "arm" else "right")
    for r in rows:
        table.add_row(
            r["arm"],
            f"{r['naive_tok_s']:,.0f}",
            f"{r['default_tok_s']:,.0f}",
            f"{r['speedup_vs_naive']:.1f}x",
            f"{r['harness_tok_s']:,.0f}",
            f"{r['ceiling_vs_naive']:.1f}x",
        )
    console(width=200, highlight=True).print(table)
    typer.echo(
        "harness: the model with every mixer replaced by the identity; ceiling: the speedup a free mixer would give"
    )
