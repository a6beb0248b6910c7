"""orchestrator db upgrade | create-reader | prune."""

from __future__ import annotations

import os
from typing import Optional

import typer

from orchestrator.cli.app import DB_HELP, db_app


@db_app.command("upgrade")
def upgrade(db: Optional[str] = typer.Option(None, "--db", help=DB_HELP)) -> int:
    """Create or migrate the schema to the newest revision (stamps an unversioned one first)."""
    from orchestrator.store.engine import describe, make_engine, resolve_url, upgrade as up

    url = resolve_url(db)
    before, after = up(make_engine(url))
    print(f"{describe(url)}: schema {before or 'empty'} -> {after}")
    return 0


@db_app.command("create-reader")
def create_reader(
    role: str = typer.Argument(..., help="name of the new read-only PostgreSQL role"),
    db: Optional[str] = typer.Option(None, "--db", help="postgresql:// URL of a role allowed to create roles"),
    password_env: Optional[str] = typer.Option(
        None,
        "--password-env",
        help="environment variable holding the new role's password (never given on the command line)",
    ),
    timeout: float = typer.Option(60.0, "--timeout", help="the role's statement_timeout, s"),
) -> int:
    """Make a login role that can only read the result tables (for `sql`, `ui`, notebooks)."""
    from orchestrator.errors import UserError
    from orchestrator.store.engine import resolve_url
    from orchestrator.store.readonly import create_reader as make

    password = None
    if password_env is not None:
        password = os.environ.get(password_env)
        if not password:
            raise UserError(f"--password-env {password_env}: the variable is not set")
    for st in make(resolve_url(db), role, password=password, timeout_s=timeout):
        print(st + ";")
    return 0


@db_app.command("prune")
def prune(
    sweep: str = typer.Argument(..., help="a finished sweep (no trial pending or running, no live driver)"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="print what would be freed; delete nothing"),
    vacuum: bool = typer.Option(
        False, "--vacuum", help="SQLite: then VACUUM, so the file shrinks (it otherwise keeps freed pages for reuse)"
    ),
) -> int:
    """Delete the checkpoints of a finished sweep's completed and diverged trials and print
    what it freed. A trial given a longer budget afterwards trains again from step 0."""
    from orchestrator.store import retention
    from orchestrator.store.engine import open_store_engine

    engine, _ = open_store_engine(db, auto_create=False)
    if vacuum:
        retention.require_vacuum(engine)
    done = retention.prune(engine, sweep, dry_run=dry_run)
    verb = "would free" if done.dry_run else "freed"
    print(f"{done.sweep}: {verb} {done.checkpoints} checkpoint(s), {done.nbytes / 1e6:.2f} MB ({done.nbytes:,} bytes)")
    if vacuum and not dry_run:
        shrunk = retention.vacuum(engine)
        print(f"VACUUM: the database file shrank by {shrunk / 1e6:.2f} MB")
    return 0
