"""The typer applications every command module registers on.

Each command family lives in its own module (``run_cmds``, ``db_cmds``, ``zoo_cmds``,
``analysis_cmds``, ``bench_cmds``) and decorates these apps, so the CLI grows without one
file that everybody edits. Examples shown under each command's help live in
:mod:`orchestrator.cli.help`.
"""

from typing import Any

import typer
from rich.console import Console, ConsoleDimensions

# Rendering width off a terminal: wide enough that rich never wraps or crops a line.
UNWRAPPED = 1_000_000


class CliConsole(Console):
    """rich's Console, except that off a terminal (piped, redirected, captured) nothing is
    wrapped: rich would fold every line at 80 columns (or $COLUMNS), so a long hint, path or
    table row piped into a file or another program would arrive in pieces. On a terminal it
    is rich's own width (or the ``width`` given)."""

    @property
    def size(self) -> ConsoleDimensions:
        got = super().size
        return got if self.is_terminal else ConsoleDimensions(UNWRAPPED, got.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


def console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """The console every command prints through (stdout, or stderr with ``stderr=True``)."""
    kwargs.setdefault("highlight", False)
    return CliConsole(stderr=stderr, **kwargs)


def prog() -> str:
    """The command as the user can type it again: ``orchestrator`` where that is what the
    shell finds, else the path it was invoked by (``.venv/bin/orchestrator`` from a shell
    whose venv is not active), so a printed hint runs as printed."""
    import os
    import shlex
    import shutil
    import sys

    invoked = sys.argv[0] if sys.argv else ""
    if os.path.basename(invoked) != "orchestrator" or os.sep not in invoked:
        return "orchestrator"
    found = shutil.which("orchestrator")
    if found and os.path.realpath(found) == os.path.realpath(invoked):
        return "orchestrator"
    return shlex.quote(invoked)


# The one sentence every --db option shows (the lookup order is resolve_url's).
DB_HELP = (
    "database URL or SQLite file; without --db: the spec's storage: where a spec is "
    "given, else $ORCH_DB, else runs/orchestrator.db under the current directory"
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("orchestrator")
        except PackageNotFoundError:  # a source tree that was never installed
            v = "unknown"
        typer.echo(f"orchestrator {v}")
        raise typer.Exit(0)


app = typer.Typer(
    name="orchestrator",
    help="Sweeps of tiny recurrent models on Ray Tune, traces in SQL, statistics off the database.",
    no_args_is_help=True,
    add_completion=True,  # orchestrator --install-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the installed orchestrator version and exit"
    ),
) -> None:
    """Sweeps of tiny recurrent models on Ray Tune, traces in SQL, statistics off the database."""


db_app = typer.Typer(help="Database schema management.", no_args_is_help=True)
bench_app = typer.Typer(
    help="Benchmarks that print figures (speed and memory targets live here).", no_args_is_help=True
)
app.add_typer(db_app, name="db")
app.add_typer(bench_app, name="bench")
