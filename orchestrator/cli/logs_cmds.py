"""``orchestrator logs SWEEP --trial KEY [--attempt N] [--follow]``: what a trial's attempts
printed (their console tails, ``attempts.log``) and the tracebacks recorded against them
(``trial_errors``), as stored text: control characters escaped, never markup."""

from __future__ import annotations

import json
import time
from typing import Optional

import typer

from orchestrator.cli.app import DB_HELP, app, console
from orchestrator.errors import UserError, printable

out = console()

FOLLOW_EVERY_S = 1.0


def _unprinted(log: str | None, printed: str) -> str:
    """The part of an attempt's stored console not printed yet: what follows what was
    printed, or all of it when the stored tail moved past that (its front was dropped)."""
    log = log or ""
    return log[len(printed) :] if log.startswith(printed) else log


@app.command("logs")
def logs(
    sweep: str = typer.Argument(..., help="sweep name (see `orchestrator ls`)"),
    trial: str = typer.Option(..., "--trial", help="the trial's key (see `orchestrator status SWEEP`)"),
    attempt: Optional[int] = typer.Option(None, "--attempt", help="one attempt (1 = the first); default every one"),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="keep printing the newest attempt's console until it ends"
    ),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    as_json: bool = typer.Option(False, "--json", help="every attempt's log and errors as JSON"),
) -> int:
    """Print what a trial's attempts wrote to stdout/stderr (the last $ORCH_LOG_TAIL_KIB KiB of
    each, default 64) and the traceback of each failure."""
    from orchestrator.store import reader
    from orchestrator.store.engine import open_store_engine

    engine, _ = open_store_engine(db, auto_create=False)
    try:

        def read() -> list:
            with engine.connect() as conn:
                row = reader.trial_row(conn, reader.sweep_id(conn, sweep), trial)
                if row is None:
                    raise UserError(f"sweep {sweep!r} has no trial {trial!r} (keys: `orchestrator status {sweep}`)")
                stories = reader.attempt_stories(conn, row.id)
            if attempt is not None:
                stories = [s for s in stories if s.attempt == attempt]
                if not stories:
                    raise UserError(f"trial {trial!r} has no attempt {attempt}")
            return stories

        stories = read()
        if as_json:
            print(json.dumps([vars(s) for s in stories], default=str, indent=2))
            return 0
        if not stories:
            out.print(f"trial {printable(trial)}: no attempt recorded yet")
            return 0
        printed: dict[object, str] = {}
        done: set[object] = set()
        while True:
            for s in stories:
                if s.attempt in done:
                    continue
                if s.attempt not in printed:
                    head = f"attempt {s.attempt}" if s.attempt is not None else "before attempts were recorded"
                    how = f", from step {s.from_step}" if s.from_step else ""
                    out.print(f"==> {head}{how}: {s.outcome or 'running'} <==", markup=False, highlight=False)
                text = _unprinted(s.log, printed.get(s.attempt, ""))
                printed[s.attempt] = s.log or ""
                if text:
                    out.print(printable(text.rstrip("\n"), keep="\n\t"), markup=False, highlight=False, soft_wrap=True)
                if s.outcome is not None or s.ended_at is not None or s.attempt is None:
                    for e in s.errors:
                        out.print(f"--- {e['kind']} error: {printable(e['error'])}", markup=False, highlight=False)
                        if e["traceback"]:
                            out.print(
                                printable(e["traceback"].rstrip("\n"), keep="\n\t"),
                                markup=False,
                                highlight=False,
                                soft_wrap=True,
                            )
                    done.add(s.attempt)
            newest = stories[-1]
            if not follow or newest.attempt in done:
                return 0
            time.sleep(FOLLOW_EVERY_S)
            stories = [s for s in read() if s.attempt not in done]
            if not stories:
                return 0
    finally:
        engine.dispose()
