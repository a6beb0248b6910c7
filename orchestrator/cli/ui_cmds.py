"""orchestrator ui: the read-only web dashboard."""

from __future__ import annotations

from typing import Optional

import typer

from orchestrator.cli.app import app
from orchestrator.ui.guard import TOKEN_ENV
from orchestrator.ui.settings import DEFAULT_PORT, REQUEST_TIMEOUT_S

DB_HELP = "database URL or SQLite path (default: $ORCH_DB, else runs/orchestrator.db)"


@app.command()
def ui(
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (anything but loopback needs --token)"),
    port: int = typer.Option(
        DEFAULT_PORT,
        "--port",
        min=0,
        max=65535,
        help=f"port (default {DEFAULT_PORT}; Ray's dashboard is 8265; 0: any free one, printed)",
    ),
    token: Optional[str] = typer.Option(
        None,
        "--token",
        envvar=TOKEN_ENV,
        show_envvar=True,
        help="secret every request must carry (printed once in the URL); required off loopback",
    ),
    allow_host: list[str] = typer.Option(
        [], "--allow-host", help="another name the browser may use for this server (repeatable)"
    ),
    request_timeout: float = typer.Option(
        REQUEST_TIMEOUT_S, "--request-timeout", help="seconds a request's database work may take before it is cancelled"
    ),
) -> int:
    """Serve a live dashboard of the database's sweeps (read-only) until Ctrl-C."""
    from orchestrator.ui.app import serve

    serve(
        db,
        host,
        port,
        announce=lambda s: print(s, flush=True),
        token=token or None,
        allow_hosts=tuple(allow_host),
        request_timeout_s=request_timeout,
    )
    return 0


def ui_command(db_url: str) -> str:
    """The command line that opens the dashboard on ``db_url`` (printed by submit)."""
    import shlex

    from orchestrator.store.engine import describe

    from orchestrator.cli.app import prog

    return f"{prog()} ui --db {shlex.quote(describe(db_url))}"
