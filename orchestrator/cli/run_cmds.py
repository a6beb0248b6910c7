"""submit, resume, status, ls, sql: running sweeps and looking at them."""
from __future__ import annotations

import csv
import json
import sys
from typing import Optional

import typer
from rich.console import Console

from orchestrator.cli.app import app

err = Console(stderr=True, highlight=False)
out = Console(highlight=False)

DB_HELP = "database URL or SQLite path (default: $ORCH_DB, else runs/orchestrator.db)"


class _Progress:
    """A rich progress bar over trials; --quiet replaces it with nothing."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.bar = None
        self.counts = {"running": 0, "completed": 0, "diverged": 0, "failed": 0, "retry": 0}

    def start(self, db: str, total: int, todo: int) -> None:
        if not self.quiet:
            err.print(f"database: {db}")
            err.print(f"trials: {total} in sweep, {total - todo} already finished, {todo} to run")
        if self.quiet or todo == 0:
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TextColumn("{task.fields[detail]}"),
                            TimeElapsedColumn(), TimeRemainingColumn(), console=err,
                            transient=False)
        self.task = self.bar.add_task("trials", total=todo, detail="")
        self.bar.start()

    def event(self, kind: str, trial, **info) -> None:
        if kind == "packing":
            if not self.quiet:
                err.print(f"seed packs: pack_seeds {info['pack_seeds']} = up to {info['size']} "
                          f"trials per pack; {info['packs']} pack(s) in {info['units']} unit(s)")
            return
        if kind == "start":
            self.counts["running"] += 1
        elif kind in ("completed", "diverged", "failed"):
            self.counts["running"] = max(0, self.counts["running"] - 1)
            self.counts[kind] += 1
        elif kind == "retry":
            self.counts["retry"] += 1
        if self.bar is not None and kind != "result":
            c = self.counts
            detail = (f"run {c['running']} ok {c['completed']} div {c['diverged']} "
                      f"fail {c['failed']}" + (f" retry {c['retry']}" if c["retry"] else ""))
            done = c["completed"] + c["diverged"] + c["failed"]
            self.bar.update(self.task, completed=done, detail=detail)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _run_with_progress(run, target, quiet: bool, **kwargs) -> int:
    """Run a submit/resume with the progress bar, then print the outcome."""
    from orchestrator.runner.lifecycle import EXIT_INTERRUPTED

    progress = _Progress(quiet)
    name = target if isinstance(target, str) else target.name
    try:
        summary = run(target, on_start=progress.start, on_event=progress.event,
                      note=lambda msg: err.print(msg, soft_wrap=True), **kwargs)
    except KeyboardInterrupt:
        # A second Ctrl-C while the trials were stopping.
        progress.stop()
        err.print(f"sweep {name}: interrupted; {_resume_hint(name, kwargs.get('db'))}",
                  soft_wrap=True)
        return EXIT_INTERRUPTED
    finally:
        progress.stop()
    return _finish(summary, quiet)


def _resume_hint(name: str, db: str | None) -> str:
    return f"continue with `orchestrator resume {name}" + (f" --db {db}`" if db else "`")


def _finish(summary, quiet: bool) -> int:
    if summary.stopped is not None:
        from orchestrator.runner.lifecycle import EXIT_INTERRUPTED

        parts = ", ".join(f"{n} {k}" for k, n in sorted(summary.outcomes.items()))
        err.print(f"sweep {summary.sweep}: stopped ({summary.stopped}): {parts or 'nothing ran'}; "
                  f"{_resume_hint(summary.sweep, summary.db_arg)}", soft_wrap=True)
        return EXIT_INTERRUPTED
    if not quiet:
        parts = ", ".join(f"{n} {k}" for k, n in sorted(summary.outcomes.items())) or "nothing ran"
        err.print(f"sweep {summary.sweep}: {parts}; query it with "
                  f"`orchestrator sql \"SELECT * FROM trial_final WHERE sweep = '{summary.sweep}'\"`")
    if summary.failed:
        err.print(f"[red]{summary.failed} trial(s) failed[/red]: see `orchestrator status "
                  f"{summary.sweep}` and the trials.error column")
        return 1
    return 0


@app.command()
def submit(
    spec: str = typer.Argument(..., help="sweep spec YAML (sweeps/*.yaml)"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    address: Optional[str] = typer.Option(
        None, "--address", help="join a running Ray cluster: auto or HOST:PORT"),
    max_concurrent: Optional[int] = typer.Option(None, "--max-concurrent", min=1),
    checkpoint_dir: Optional[str] = typer.Option(
        None, "--checkpoint-dir", help="shared directory for trial checkpoints"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the expanded design and exit"),
    as_json: bool = typer.Option(False, "--json", help="with --dry-run: JSON output"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
    takeover: bool = typer.Option(
        False, "--takeover", help="run even if another driver holds the sweep's lease"),
    amend: bool = typer.Option(
        False, "--amend", "--yes", help="apply a changed design to an existing sweep "
        "(trials it no longer has become superseded)"),
) -> int:
    """Run a sweep: expand the spec, record its trials, run the unfinished ones on Ray Tune."""
    from orchestrator import spec as specs

    sweep = specs.load(spec)
    if dry_run:
        if address is None:
            # No cluster to ask: a `device: cuda` trial on a machine without CUDA fails in
            # its worker every time, so the dry run says so now.
            import torch

            from orchestrator.runner.sweep import check_devices

            check_devices(sweep.trials, float(torch.cuda.device_count()), "this machine")
        if as_json:
            out.print_json(json.dumps({"trials": len(sweep.trials), "axes": sweep.axes},
                                      default=str))
        else:
            out.print(f"sweep {sweep.name}: {len(sweep.trials)} trials")
            for name, values in sweep.axes.items():
                out.print(f"  {name}: {', '.join(map(str, values))}")
        return 0
    from orchestrator.runner.sweep import submit as run_submit

    return _run_with_progress(run_submit, sweep, quiet, db=db, address=address,
                              max_concurrent=max_concurrent, checkpoint_dir=checkpoint_dir,
                              takeover=takeover, amend=amend)


@app.command()
def resume(
    sweep: str = typer.Argument(..., help="sweep name (see `orchestrator ls`)"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    address: Optional[str] = typer.Option(None, "--address"),
    max_concurrent: Optional[int] = typer.Option(None, "--max-concurrent", min=1),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    takeover: bool = typer.Option(
        False, "--takeover", help="run even if another driver holds the sweep's lease"),
) -> int:
    """Run what a sweep has not finished; running, stale and interrupted trials continue
    from their checkpoints."""
    from orchestrator.runner.sweep import resume as run_resume

    return _run_with_progress(run_resume, sweep, quiet, db=db, address=address,
                              max_concurrent=max_concurrent, checkpoint_dir=checkpoint_dir,
                              takeover=takeover)


@app.command()
def status(
    sweep: Optional[str] = typer.Argument(None, help="sweep name; all sweeps when omitted"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    as_json: bool = typer.Option(False, "--json"),
) -> int:
    """Counts by status, per-axis completion and an ETA."""
    from orchestrator.store.engine import open_store_engine
    from orchestrator.store.status import sweep_status

    engine, _ = open_store_engine(db, auto_create=False)
    report = sweep_status(engine, sweep)
    if as_json:
        out.print_json(json.dumps(report, default=str))
        return 0
    from rich.table import Table

    for s in report["sweeps"]:
        counts = " ".join(f"{k} {v}" for k, v in s["counts"].items() if v)
        eta = f", ETA {s['eta_s'] / 60:.1f} min" if s.get("eta_s") else ""
        prog = f", {100 * s['progress']:.0f}% of steps" if s.get("progress") is not None else ""
        out.print(f"[bold]{s['sweep']}[/bold]: {s['total']} trials: {counts}{prog}{eta}")
        if s.get("driver"):
            out.print(f"  run by {s['driver']}")
        if s["counts"].get("stale"):
            out.print(f"  {s['counts']['stale']} stale trial(s): their driver stopped "
                      f"heartbeating; `orchestrator resume {s['sweep']}` re-runs them")
        if s["axes"]:
            table = Table(show_header=True, header_style="bold")
            for col in ("axis", "value", "done", "total"):
                table.add_column(col)
            for axis, rows in s["axes"].items():
                for r in rows:
                    table.add_row(axis, str(r["value"]), str(r["done"]), str(r["total"]))
            out.print(table)
        for f in s.get("failed", [])[:10]:
            out.print(f"  [red]failed[/red] {f['key']}: {f['error']}")
    return 0


@app.command("ls")
def list_sweeps(db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
                as_json: bool = typer.Option(False, "--json")) -> int:
    """Sweeps in a database."""
    from orchestrator.store.engine import open_store_engine
    from orchestrator.store.repo import list_sweeps as _ls

    engine, _ = open_store_engine(db, auto_create=False)
    rows = _ls(engine)
    if as_json:
        out.print_json(json.dumps(rows, default=str))
        return 0
    for r in rows:
        stale = f", {r['stale']} stale" if r.get("stale") else ""
        out.print(f"{r['name']}\t{r['completed'] or 0}/{r['trials']} completed{stale}\t{r['created_at']}")
    return 0


@app.command()
def sql(
    query: str = typer.Argument(..., help="one SELECT (or WITH/EXPLAIN/reading PRAGMA)"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    as_csv: bool = typer.Option(False, "--csv", help="CSV on stdout"),
    as_json: bool = typer.Option(False, "--json", help="JSON list of row objects"),
) -> int:
    """Read-only SQL on the result database (writes are refused, the DB is untouched)."""
    from orchestrator.store.engine import resolve_url
    from orchestrator.store.readonly import readonly_query

    cols, rows = readonly_query(resolve_url(db), query)
    if as_csv:
        w = csv.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
    elif as_json:
        print(json.dumps([dict(zip(cols, r)) for r in rows], default=str))
    else:
        from rich.table import Table

        table = Table(*cols, show_header=True, header_style="bold")
        for r in rows:
            table.add_row(*("" if v is None else str(v) for v in r))
        out.print(table)
        err.print(f"{len(rows)} row(s)")
    return 0
