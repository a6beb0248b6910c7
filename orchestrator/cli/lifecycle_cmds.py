"""cancel, delete: ending a sweep's run from anywhere, and removing a sweep."""

from __future__ import annotations

import shutil
import sys
from typing import Optional

import typer
from orchestrator.cli.app import app, console
from orchestrator.errors import UserError

err = console(stderr=True)
DB_HELP = "database URL or SQLite path (default: $ORCH_DB, else runs/orchestrator.db)"


def _find(engine, name: str) -> tuple[int, str]:
    from orchestrator.store import reader

    with engine.connect() as conn:
        found = reader.find_sweep(conn, name)
        if found is None:
            raise reader.UnknownSweep(name, reader.sweep_names(conn))
    return found


@app.command()
def cancel(
    sweep: str = typer.Argument(..., help="sweep name (see `orchestrator ls`)"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> int:
    """Stop a running sweep from any terminal or machine: every driver running it (`submit`,
    `resume`, each `join`) sees the request at its next renewal, stops its trials
    (interrupted) and exits 130. A sweep with no live driver has its leftover running trials
    marked interrupted."""
    from orchestrator.store import claims, lease
    from orchestrator.store.engine import open_store_engine

    engine, _url = open_store_engine(db, auto_create=False)
    sid, _ = _find(engine, sweep)
    ttl = lease.lease_ttl_s()
    with engine.begin() as conn:
        held = lease.holder(conn, sid)
        flagged = claims.request_cancel(conn, sid, ttl=ttl)
        if flagged or (held is not None and not held.expired):
            lease.request_cancel(conn, sid)
            who = f"{flagged} driver(s)" if flagged else held.summary() if held else "its driver"
            msg = f"sweep {sweep}: cancel requested; {who} stop(s) within {ttl / 4:.0f} s"
        else:
            n = lease.interrupt_running(conn, sid)
            msg = f"sweep {sweep}: no driver is running it; {n} leftover running trial(s) marked interrupted"
    err.print(msg, soft_wrap=True)
    return 0


@app.command()
def delete(
    sweep: str = typer.Argument(..., help="sweep name (see `orchestrator ls`)"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask"),
    keep_checkpoints: bool = typer.Option(False, "--keep-checkpoints", help="leave the checkpoint folder on disk"),
    checkpoint_dir: Optional[str] = typer.Option(
        None, "--checkpoint-dir", help="where its checkpoints are, if not the default"
    ),
) -> int:
    """Delete a sweep: its trials, parameters, evals, checkpoints, attempts and errors (one
    transaction) and its checkpoint files, if any. Refuses a sweep a live driver holds."""
    from orchestrator import spec as specs
    from orchestrator.runner.sweep import checkpoint_folders
    from orchestrator.store import claims, lease, repo
    from orchestrator.store.engine import open_store_engine

    engine, url = open_store_engine(db, auto_create=False)
    sid, text = _find(engine, sweep)

    def running(conn) -> str | None:
        """Who runs the sweep now (a lease holder or a live driver), or None."""
        held = lease.holder(conn, sid)
        if held is not None and not held.expired:
            return held.summary()
        live = claims.drivers(conn, sid, ttl=lease.lease_ttl_s(), live_only=True)
        return live[0].summary() + (f" and {len(live) - 1} more" if len(live) > 1 else "") if live else None

    with engine.connect() as conn:
        who = running(conn)
        n = repo.count_trials(conn, sid)
    if who is not None:
        raise UserError(f"sweep {sweep!r} is being run by {who}; `orchestrator cancel {sweep}` first")
    try:
        spec = specs.load(f"<sweep {sweep}>", text=text).spec
        found = [f / sweep for f in checkpoint_folders(url, spec, checkpoint_dir) if (f / sweep).exists()]
        folder = found[0] if found else None
    except UserError:  # an imported sweep's placeholder spec: no checkpoints of ours
        folder = None
    if not yes:
        if not sys.stdin.isatty():
            raise UserError(f"delete sweep {sweep!r} ({n} trials): pass --yes to confirm")
        if not typer.confirm(
            f"delete sweep {sweep} ({n} trials)" + (f" and {folder}" if folder and not keep_checkpoints else "") + "?"
        ):
            err.print("nothing deleted")
            return 1
    with engine.begin() as conn:
        # Re-checked inside the transaction: a driver may have claimed it since.
        who = running(conn)
        if who is not None:
            raise UserError(f"sweep {sweep!r} is being run by {who}")
        counts = repo.delete_sweep(conn, sid)
    removed = ""
    if folder is not None and not keep_checkpoints and folder.exists():
        shutil.rmtree(folder)
        removed = f"; removed {folder}"
    err.print(f"deleted sweep {sweep}: {counts['trials']} trials, {counts['evals']} evals" + removed)
    return 0
