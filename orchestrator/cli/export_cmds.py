"""``orchestrator export``: a sweep as files any tool reads (pandas, polars, DuckDB, R)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from orchestrator.cli.app import DB_HELP, app


@app.command("export")
def export_cmd(
    sweep: str = typer.Argument(..., help="sweep name (see `orchestrator ls`)"),
    fmt: str = typer.Option("parquet", "--format", help="parquet or csv"),
    out: Path = typer.Option(
        ..., "--out", help="folder to write trials, evals and spec.yaml into (created if missing)"
    ),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> int:
    """Write a sweep's trials (one column per parameter), evals and spec text as files."""
    from orchestrator.store.engine import open_store_engine
    from orchestrator.store.export import export_sweep

    if fmt not in ("parquet", "csv"):
        from orchestrator.errors import UserError

        raise UserError(f"--format {fmt!r}: expected parquet or csv")
    engine, _ = open_store_engine(db, auto_create=False)
    for p in export_sweep(engine, sweep, fmt, out):
        print(p)
    return 0
