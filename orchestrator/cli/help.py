"""What every command's ``--help`` shows beyond its own docstring: an example (the epilog),
the one database sentence on every ``--db``, shared descriptions of the options several
commands repeat, and flags without a ``<bool>`` type column.

Applied once to the registered typer apps (:func:`polish`, called by the CLI's ``__init__``
after every ``*_cmds`` module registered its commands), so a new command gets the same
treatment by adding its example here; ``tests/test_cli_help.py`` fails when one is missing.
"""

from __future__ import annotations

import inspect

import typer
from typer.models import OptionInfo

from orchestrator.cli.app import DB_HELP

# Command path (as typed after ``orchestrator``) -> examples, one per line.
EXAMPLES: dict[str, list[str]] = {
    "": ["orchestrator submit sweeps/quickstart.yaml", "orchestrator report quickstart"],
    "submit": [
        "orchestrator submit sweeps/quickstart.yaml",
        "orchestrator submit sweeps/quickstart.yaml --dry-run",
        "orchestrator submit sweeps/quickstart.yaml --db postgresql://HOST/DB --address HEAD:6379",
    ],
    "resume": ["orchestrator resume quickstart", "orchestrator resume quickstart --max-concurrent 2"],
    "join": [
        "orchestrator join quickstart --db postgresql://HOST/DB",
        "orchestrator join quickstart --db postgresql://HOST/DB --address auto --max-concurrent 8",
    ],
    "slurm": [
        "orchestrator slurm quickstart --db postgresql://HOST/DB --jobs 3 --dry-run",
        "orchestrator slurm quickstart --db postgresql://HOST/DB --jobs 8 --sbatch-arg=--partition=a100 "
        "--sbatch-arg=--gres=gpu:1 --sbatch-arg=--cpus-per-task=4",
    ],
    "status": ["orchestrator status", "orchestrator status quickstart --json"],
    "ls": ["orchestrator ls", "ORCH_DB=runs/other.db orchestrator ls --json"],
    "sql": [
        'orchestrator sql "SELECT sweep, status, count(*) FROM trial_final GROUP BY 1, 2"',
        'orchestrator sql "SELECT * FROM evals LIMIT 5" --csv > evals.csv',
    ],
    "export": [
        "orchestrator export quickstart --format parquet --out exports/quickstart",
        "orchestrator export quickstart --format csv --out exports/quickstart",
    ],
    "analyze": [
        "orchestrator analyze quickstart lockin --by arm",
        "orchestrator analyze sweeps/quickstart.yaml fisher --json",
    ],
    "report": ["orchestrator report quickstart", "orchestrator report quickstart --format svg --out reports/qs"],
    "import": ["orchestrator import traces.jsonl --sweep external"],
    "cells": ["orchestrator cells", "orchestrator cells --arms deltanet,armed_gdn --d-model 64"],
    "tasks": ["orchestrator tasks", "orchestrator tasks --floors --json"],
    "tasks selftest": ["orchestrator tasks selftest"],
    "db": ["orchestrator db upgrade --db runs/orchestrator.db"],
    "db upgrade": ["orchestrator db upgrade", "orchestrator db upgrade --db postgresql://HOST/DB"],
    "db prune": ["orchestrator db prune quickstart --dry-run", "orchestrator db prune quickstart --vacuum"],
    "db create-reader": [
        "orchestrator db create-reader orch_reader --db postgresql://ADMIN@HOST/DB",
        "ORCH_READER_PW=... orchestrator db create-reader orch_reader "
        "--password-env ORCH_READER_PW --db postgresql://ADMIN@HOST/DB",
    ],
    "bench": ["orchestrator bench cells --arms deltanet --seq-len 128"],
    "bench analysis": ["orchestrator bench analysis --trials 2000"],
    "bench store": ["orchestrator bench store --rows 20000 --sweep-trials 0"],
    "bench pack": ["orchestrator bench pack --seeds 4 --steps 50"],
    "bench cells": ["orchestrator bench cells --arms deltanet,attention --seq-len 128"],
    "bench kernels": ["orchestrator bench kernels --quick"],
    "bench tasks": ["orchestrator bench tasks --json"],
    "bench ui": ["orchestrator bench ui --trials 2000"],
    "bench overhead": ["orchestrator bench overhead --trials 1000 --trial-seconds 1 --json"],
    "bench checkpoints": ["orchestrator bench checkpoints --repeats 3"],
    "ui": ["orchestrator ui", "orchestrator ui --db postgresql://HOST/DB --port 8270"],
    "delete": ["orchestrator delete quickstart"],
    "cancel": ["orchestrator cancel quickstart"],
    "design": ["orchestrator design power --test fisher --rates 0.9,0.4"],
    "design power": [
        "orchestrator design power --test fisher --rates 0.9,0.4",
        "orchestrator design power --test logrank --medians 600,2400 --budget 5000",
    ],
    "logs": [
        "orchestrator logs basin_map --trial 3f2a9c1d0b7e4f61",
        "orchestrator logs basin_map --trial 3f2a9c1d0b7e4f61 --attempt 2 --follow",
    ],
    "design replay": [
        "orchestrator design replay sweeps/sequential_quick.yaml --sweep sequential_quick",
        "orchestrator design replay my_design.yaml --sweep finished_study --json",
    ],
}

# Options several commands share: one description each, used where a declaration has none.
COMMON_HELP: dict[str, str] = {
    "--json": "print JSON instead of a table",
    "--quiet": "no progress bar or summary lines",
    "--address": "join a running Ray cluster (auto, or HEAD_HOST:PORT) instead of starting a local one",
    "--max-concurrent": "most trials running at once (default: the spec's max_concurrent, else "
    "as many as the CPUs allow)",
    "--checkpoint-dir": "directory for trial checkpoints, shared by all nodes (default: next to the database)",
}


def epilog(path: str) -> str:
    """The ``Examples`` block of one command (typer's rich help keeps ``\\b`` blocks verbatim)."""
    lines = EXAMPLES.get(path, [])
    return "\b\nExamples:\n" + "\n".join(f"  $ {line}" for line in lines) if lines else ""


def _polish_options(callback) -> None:
    if callback is None:
        return
    for p in inspect.signature(callback).parameters.values():
        info = p.default
        if not isinstance(info, OptionInfo):
            continue
        names = [info.default] if isinstance(info.default, str) else []
        names += list(info.param_decls or ())
        long = next((n for n in names if isinstance(n, str) and n.startswith("--")), None)
        if long == "--db":
            info.help = DB_HELP
        elif not info.help and long in COMMON_HELP:
            info.help = COMMON_HELP[long]
        if (
            p.annotation in (bool, "bool", "Optional[bool]") or isinstance(info.default, bool)
        ) and info.metavar is None:
            info.metavar = ""  # a flag takes no value: no "<bool>" column


def short_help(doc: str | None) -> str | None:
    """A command's line in its group's listing: its help's first sentence as one line, which
    rich wraps at the terminal's width (the docstring's hard line breaks would break the
    listing mid-sentence). ``--help`` of the command itself still shows all of it."""
    if not doc:
        return None
    first = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    depth, quoted = 0, False
    for i, ch in enumerate(first):
        if ch == "`":
            quoted = not quoted
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif ch == "." and not depth and not quoted and first[i + 1 : i + 2] in (" ", ""):
            return first[: i + 1]
    return first


def polish(app: typer.Typer, path: str = "") -> None:
    """Add examples and shared option texts to every command registered on ``app``."""
    if not path and app._add_completion:
        # typer adds --install-completion / --show-completion from this function's options:
        # flags too, shown without a "<bool>" column like every other flag.
        from typer import completion

        _polish_options(completion._install_completion_placeholder_function)
    if app.registered_callback is not None:
        _polish_options(app.registered_callback.callback)
    if path in EXAMPLES and not app.info.epilog:
        app.info.epilog = epilog(path)
    for cmd in app.registered_commands:
        name = cmd.name or (cmd.callback.__name__.replace("_", "-") if cmd.callback else "")
        sub = f"{path} {name}".strip()
        cmd.epilog = cmd.epilog or epilog(sub)
        if cmd.short_help is None:
            cmd.short_help = short_help(cmd.help or (cmd.callback.__doc__ if cmd.callback else None))
        _polish_options(cmd.callback)
    for group in app.registered_groups:
        sub = f"{path} {group.name}".strip()
        if sub in EXAMPLES:
            group.epilog = group.epilog or epilog(sub)
        if group.typer_instance is not None:
            polish(group.typer_instance, sub)
