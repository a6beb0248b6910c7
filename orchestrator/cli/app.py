"""The typer applications every command module registers on.

Each command family lives in its own module (``run_cmds``, ``db_cmds``, ``zoo_cmds``,
``analysis_cmds``, ``bench_cmds``) and decorates these apps, so the CLI grows without one
file that everybody edits.
"""
import typer

app = typer.Typer(
    name="orchestrator",
    help="Sweeps of tiny recurrent models on Ray Tune, traces in SQL, statistics off the database.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Database schema management.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks that print figures (speed and memory targets live here).",
                        no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(bench_app, name="bench")
