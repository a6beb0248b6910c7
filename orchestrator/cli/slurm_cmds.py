"""orchestrator slurm: a sweep run by a SLURM job array, each task an ``orchestrator join``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from orchestrator.cli.app import DB_HELP, app, console
from orchestrator.errors import UserError

err = console(stderr=True)

PASSWORD_NOTE = (
    "the URL's password is left out of the script: each task reads it from ~/.pgpass or $PGPASSWORD "
    "(submitting sets $PGPASSWORD for sbatch, which hands its environment to the tasks)"
)


def task_db(url: str) -> tuple[str, str | None]:
    """The database as the tasks name it, and the password taken out of it (None: none).
    A SQLite URL becomes its absolute path; a PostgreSQL URL keeps everything but the
    password, which a script (a file other users of the cluster may read, and SLURM keeps a
    copy of) never holds in clear."""
    from orchestrator.store.dialect import sqlite_path

    path = sqlite_path(url)
    if path is not None:
        return str(path), None
    import sqlalchemy as sa

    parsed = sa.engine.make_url(url)
    if parsed.password is None:
        return url, None
    # URL.set() reads None as "unchanged": the named tuple's own replace drops it.
    return parsed._replace(password=None).render_as_string(hide_password=False), str(parsed.password)


def orchestrator_command() -> list[str]:
    """How a task runs this very orchestrator: the entry point beside this Python (the
    virtual environment's, by absolute path, as a shared file system shows it on every
    node), else ``python -m orchestrator.cli``."""
    bindir = os.path.abspath(os.path.dirname(sys.executable))
    entry = os.path.join(bindir, "orchestrator")
    if os.path.isfile(entry) and os.access(entry, os.X_OK):
        return [entry]
    return [os.path.abspath(sys.executable), "-m", "orchestrator.cli"]


@app.command("slurm")
def slurm(
    sweep: str = typer.Argument(..., help="a submitted sweep's name (see `orchestrator ls`)"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    jobs: int = typer.Option(..., "--jobs", help="array tasks: each one `orchestrator join` with a Ray of its own"),
    sbatch_arg: Optional[list[str]] = typer.Option(
        None,
        "--sbatch-arg",
        metavar="OPTION",
        help="an sbatch option written verbatim as an #SBATCH line, e.g. --partition=a100 or "
        "--gres=gpu:1 (repeat it for more)",
    ),
    grace: int = typer.Option(
        60,
        "--grace",
        help="seconds before the time limit at which SLURM sends TERM (--signal=B:TERM@GRACE): "
        "the trials store their checkpoints and the task ends",
    ),
    job_name: Optional[str] = typer.Option(None, "--job-name", help="the array's name (default orch-SWEEP)"),
    log_dir: str = typer.Option(
        "runs/slurm", "--log-dir", help="folder of the script and the tasks' output files (one per task)"
    ),
    max_concurrent: Optional[int] = typer.Option(
        None, "--max-concurrent", min=1, help="trials at once in each task (default: what its allocation fits)"
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print the script and exit (the database is not opened, nothing is submitted)"
    ),
) -> int:
    """Run a submitted sweep on a SLURM cluster: an array of --jobs tasks, each an
    `orchestrator join` of the sweep with a local Ray sized to its allocation. The script asks for --requeue and --signal=B:TERM@GRACE: a task stopped by the time
    limit, `scontrol requeue`, preemption or `scancel` checkpoints its running trials and
    releases them (exit 130); a requeued task joins again and the trials continue from their
    checkpoints. Without --dry-run the sweep must exist in the database; the script is
    written under --log-dir and handed to `sbatch`."""
    from orchestrator.runner import slurm as scripts
    from orchestrator.store.engine import resolve_url

    url = resolve_url(db)
    where, password = task_db(url)
    folder = Path(log_dir).expanduser().absolute()
    opts = scripts.ScriptOptions(
        sweep=sweep,
        db=where,
        jobs=jobs,
        command=orchestrator_command(),
        log_dir=str(folder),
        grace_s=grace,
        job_name=job_name,
        sbatch_args=tuple(sbatch_arg or ()),
        max_concurrent=max_concurrent,
    )
    text = scripts.script(opts)  # refuses bad options before anything else happens
    from orchestrator.store.dialect import sqlite_path

    if sqlite_path(url) is not None:
        err.print(
            escape(f"note: {where} is SQLite: every task must reach this one file (PostgreSQL suits a cluster)"),
            soft_wrap=True,
        )
    if password is not None:
        err.print(escape(f"note: {PASSWORD_NOTE}"), soft_wrap=True)
    if dry_run:
        sys.stdout.write(text)
        return 0
    _check_sweep(url, sweep)
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise UserError("sbatch not found on PATH: run this where SLURM is installed (--dry-run prints the script)")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{opts.name()}-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    path.write_text(text)
    env = dict(os.environ)
    if password is not None and not env.get("PGPASSWORD"):
        env["PGPASSWORD"] = password
    res = subprocess.run([sbatch, "--parsable", str(path)], env=env, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        why = (res.stderr or res.stdout).strip().splitlines()
        raise UserError(f"sbatch refused {path}: {why[0] if why else f'exit {res.returncode}'}")
    job = res.stdout.strip().split(";")[0]
    err.print(escape(f"script: {path}"), soft_wrap=True)
    err.print(escape(f"task output: {folder}/{opts.name()}-{job}_<task>.out"), soft_wrap=True)
    print(f"sweep {sweep}: submitted array job {job} ({jobs} task(s)); watch it with `squeue -j {job}`")
    return 0


def _check_sweep(url: str, sweep: str) -> None:
    """The array would only start tasks that fail: refuse a sweep the database lacks."""
    from orchestrator.store import reader
    from orchestrator.store.engine import describe, open_store_engine

    engine, _ = open_store_engine(url, auto_create=False)
    try:
        with engine.connect() as conn:
            found = reader.find_sweep(conn, sweep)
    finally:
        engine.dispose()
    if found is None:
        raise UserError(f"no sweep named {sweep!r} in {describe(url)} (submit it first; see `orchestrator ls`)")
