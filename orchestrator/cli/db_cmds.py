"""orchestrator db upgrade."""
from __future__ import annotations

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
