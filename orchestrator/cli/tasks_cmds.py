"""``orchestrator tasks [--json] [--floors]``, ``orchestrator tasks selftest`` and
``orchestrator bench tasks``."""

from __future__ import annotations

import json
from typing import Any

import typer

from orchestrator.cli.app import app, bench_app
from orchestrator.errors import UserError

tasks_app = typer.Typer(
    help="The task suite: parameters, floors, and the rebinding self-test.",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(tasks_app, name="tasks")


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc else ""


def _fmt_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "(defaults)"


@tasks_app.callback(invoke_without_command=True)
def tasks_main(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    floors: bool = typer.Option(False, "--floors", help="Floors of each task at its published settings."),
) -> None:
    """List the tasks and their parameters (or, with --floors, their floors)."""
    if ctx.invoked_subcommand is not None:
        return
    import tasks

    from orchestrator.plugins import load_installed

    load_installed()  # plugin tasks (entry points, $ORCH_PLUGINS) list like built-in ones
    from tasks.config import describe_field, field_names
    from tasks.published import PUBLISHED

    rows: list[dict[str, Any]]
    if floors:
        rows = [
            {"task": name, "params": params, "floors": tasks.build(name, **params).floors()}
            for name, params in PUBLISHED
        ]
        if json_out:
            typer.echo(json.dumps(rows, indent=2))
            return
        for r in rows:
            fl = "  ".join(f"{k}={v:.4f}" for k, v in r["floors"].items())
            typer.echo(f"{r['task']:<13} {_fmt_params(r['params']):<44} {fl}")
        return

    rows = []
    for name in tasks.NAMES:
        task = tasks.build(name)
        cfg_cls = task.Config
        rows.append(
            {
                "task": name,
                "description": _first_line(type(task).__doc__),
                "vocab_size": task.vocab_size,
                "seq_len": task.seq_len,
                "supervision": task.supervision,
                "scoring": task.scoring,
                "rebinding": task.has_rebinding,
                "params": tasks.params(name),
                "param_types": {k: describe_field(cfg_cls.model_fields[k]) for k in field_names(cfg_cls)},
            }
        )
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        typer.echo(f"{r['task']}  (vocab {r['vocab_size']}, length {r['seq_len']} at defaults)")
        typer.echo(f"  {r['description']}")
        typer.echo(
            f"  loss: {r['supervision']}; scored: {r['scoring']}; "
            f"rebinding control: {'yes' if r['rebinding'] else 'no'}"
        )
        for k, v in r["params"].items():
            typer.echo(f"    {k:<18} {v!r:<10} {r['param_types'][k]}")


@tasks_app.command("selftest")
def selftest(
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    seed: int = typer.Option(0, help="Eval seed of the sets checked."),
) -> None:
    """Validate the rebinding control's derangement; exit 1 on any failure."""
    from tasks.selftest import run_selftest

    checks = run_selftest(seed=seed)
    ok = all(c.ok for c in checks)
    if json_out:
        typer.echo(json.dumps({"ok": ok, "checks": [c.__dict__ for c in checks]}, indent=2))
    else:
        for c in checks:
            typer.echo(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
        typer.echo("selftest passed" if ok else "selftest FAILED")
    if not ok:
        raise typer.Exit(1)


# ---- bench ----------------------------------------------------------------------------------------


@bench_app.command("tasks")
def bench_tasks(
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    batch: int = typer.Option(64, help="Sequences per batch."),
    reps: int = typer.Option(5, help="Interleaved rounds; medians are reported."),
    only: str = typer.Option("", help="Comma-separated task names to bench (default: all)."),
    device: str = typer.Option("cpu", help="Device (cuda when available)."),
) -> None:
    """Batch generation time vs one training step (fwd+bwd+AdamW) of the default cell
    (armed_gdn, d_model=32, 1 layer) at each task's published settings, as a percentage."""
    import tasks

    if batch < 1 or reps < 1:
        raise UserError("--batch and --reps expect ints >= 1")
    names = [n for n in only.split(",") if n] if only else list(tasks.NAMES)
    for n in names:
        if n not in tasks.NAMES:
            raise UserError(f"unknown task {n!r} in --only (known: {', '.join(tasks.NAMES)})")
    from orchestrator.bench.tasks import GEN_BLOCK, run_bench

    rows = run_bench(names, batch, reps, device)
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(
        f"batch {batch}, device {device}, median of {reps} interleaved rounds "
        f"(generation: mean of {GEN_BLOCK} batches per round); "
        "step = armed_gdn d_model=32 1 layer fwd+bwd+AdamW"
    )
    typer.echo(f"{'task':<13} {'params':<46} {'gen ms':>9} {'step ms':>9} {'gen/step':>9}")
    for r in rows:
        st = "-" if r["step_ms"] is None else f"{r['step_ms']:.2f}"
        pct = "-" if r["gen_pct_of_step"] is None else f"{r['gen_pct_of_step']:.2f}%"
        typer.echo(f"{r['task']:<13} {_fmt_params(r['params']):<46} {r['gen_ms']:>9.3f} {st:>9} {pct:>9}")
