"""cancel, delete: ending a sweep's run from anywhere, and removing a sweep."""

from __future__ import annotations

import shutil
import sys
from typing import TYPE_CHECKING, Optional

import typer
from orchestrator.cli.app import app, console
from orchestrator.errors import UserError

if TYPE_CHECKING:
    from orchestrator.store.sweep_store import SweepStore

err = console(stderr=True)
DB_HELP = "database URL or SQLite path (default: $ORCH_DB, else runs/orchestrator.db)"


def _find(store: SweepStore, name: str) -> tuple[int, str]:
    from orchestrator.store import reader

    def find(conn) -> tuple[int, str]:
        found = reader.find_sweep(conn, name)
        if found is None:
            raise reader.UnknownSweep(name, reader.sweep_names(conn))
        return found

    return store.read(find)


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
    from orchestrator.store.sweep_store import SweepStore

    store = SweepStore.open(db, auto_create=False)
    sid, _ = _find(store, sweep)
    ttl = lease.lease_ttl_s()

    def request(conn) -> str:
        # Every driver, the lease's holder among them, has a row: its flag is the one cancel.
        flagged = claims.request_cancel(conn, sid, ttl=ttl)
        if flagged:
            return f"sweep {sweep}: cancel requested; {flagged} driver(s) stop(s) within {ttl / 4:.0f} s"
        n = claims.interrupt(conn, sweep=sid)
        return f"sweep {sweep}: no driver is running it; {n} leftover running trial(s) marked interrupted"

    err.print(store.write(request, budget_s=0), soft_wrap=True)
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
    from orchestrator.store.sweep_store import SweepStore

    store = SweepStore.open(db, auto_create=False)
    url = store.url
    sid, text = _find(store, sweep)

    def running(conn) -> str | None:
        """Who runs the sweep now (a lease holder or a live driver), or None."""
        held = lease.holder(conn, sid)
        if held is not None and not held.expired:
            return held.summary()
        live = claims.drivers(conn, sid, ttl=lease.lease_ttl_s(), live_only=True)
        return live[0].summary() + (f" and {len(live) - 1} more" if len(live) > 1 else "") if live else None

    who, n = store.read(lambda conn: (running(conn), repo.count_trials(conn, sid)))
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

    def remove(conn) -> dict[str, int]:
        # Re-checked inside the transaction: a driver may have claimed it since.
        who = running(conn)
        if who is not None:
            raise UserError(f"sweep {sweep!r} is being run by {who}")
        return repo.delete_sweep(conn, sid)

    counts = store.write(remove, budget_s=0)
    removed = ""
    if folder is not None and not keep_checkpoints and folder.exists():
        shutil.rmtree(folder)
        removed = f"; removed {folder}"
    err.print(f"deleted sweep {sweep}: {counts['trials']} trials, {counts['evals']} evals" + removed)
    return 0
