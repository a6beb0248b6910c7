"""submit, resume, join, status, ls, sql: running sweeps and looking at them."""

from __future__ import annotations

import csv
import json
import shlex
import sys
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.markup import escape

from orchestrator.cli.app import DB_HELP, app, console, prog
from orchestrator.errors import UserError
from orchestrator.status import ENDED, STALE, Status

if TYPE_CHECKING:
    from orchestrator.ui.live import BoardProgress, TrialBoard

err = console(stderr=True)
out = console()


class _Progress:
    """The overall bar in training steps plus a live table of the running trials
    (orchestrator.ui.live); --quiet replaces it with nothing."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.bar: BoardProgress | None = None
        self.board: TrialBoard | None = None
        self.counts: dict[str, int] = {s: 0 for s in (Status.running, *ENDED)} | {"retry": 0}

    def start(self, db: str, total: int, todo: int, steps: int | None = None) -> None:
        if not self.quiet:
            from orchestrator.cli.ui_cmds import ui_command

            err.print(f"database: {escape(db)}")
            err.print(f"trials: {total} in sweep, {total - todo} already finished, {todo} to run")
            err.print(escape(f"watch it live: {ui_command(db)}"), soft_wrap=True)  # copy-pasteable
        if self.quiet or todo == 0:
            return
        from orchestrator.cli.live_eta import RateBoard
        from orchestrator.ui.live import BoardProgress

        self.board = RateBoard(total_steps=steps or 0)
        self.bar = BoardProgress(self.board, console=err, transient=False)
        self.bar.start()

    @classmethod
    def _label(cls, trial, tid) -> str:
        """A trial's key and the parameters that tell trials apart at a glance."""
        from orchestrator.ui.live import LABEL_PARAMS

        for m in cls._members(trial):
            if tid is None or m.get("trial_id") == tid:
                p = m.get("params") or {}
                bits = ", ".join(f"{n} {p[n]}" for n in LABEL_PARAMS if p.get(n) is not None)
                return f"{m['key']}" + (f" ({bits})" if bits else "")
        return f"#{tid}"

    @staticmethod
    def _members(trial) -> list[dict]:
        try:
            return list(trial.config["unit"]["members"])
        except (AttributeError, KeyError, TypeError):
            return []

    def event(self, kind: str, trial, **info) -> None:
        if info.get("error") is not None:
            # A failed trial, or one an exception ended: one line saying which and why, even
            # with --quiet (its traceback is in trial_errors; Ray's own log of it is silenced).
            err.print(
                escape(f"trial {self._label(trial, info.get('trial_id'))} {kind}: {info['error']}"), soft_wrap=True
            )
        if kind == "packing":
            if not self.quiet:
                err.print(
                    f"seed packs: pack_seeds {info['pack_seeds']} = up to {info['size']} "
                    f"trials per pack; {info['packs']} pack(s) in {info['units']} unit(s)"
                )
            return
        members = self._members(trial)
        if kind == "start":
            # The members that began: every member of a unit, or a chain's one at a time.
            started = set(info.get("trial_ids") or [m.get("trial_id") for m in members])
            members = [m for m in members if m.get("trial_id") in started]
            self.counts[Status.running] += len(members)
        elif kind in ENDED:
            self.counts[Status.running] = max(0, self.counts[Status.running] - 1)
            self.counts[kind] += 1
        elif kind == "retry":
            self.counts["retry"] += 1
        if self.bar is None or self.board is None:  # both are set together
            return
        if kind == "start":
            for m in members:
                self.board.start(m["key"], m.get("params"))
        elif kind == "result":
            keys = {m["trial_id"]: m["key"] for m in members}
            for row in info.get("evals") or ():  # runner.messages.EvalRow
                key = keys.get(row.trial_id)
                if key is not None:
                    self.board.result(key, row.point.step, row.point.acc)
        elif kind in ENDED:
            tid = info.get("trial_id")
            for m in members:
                if tid is None or m.get("trial_id") == tid:
                    self.board.finish(m["key"])
        c = self.counts
        detail = (
            f"run {c[Status.running]} ok {c[Status.completed]} div {c[Status.diverged]} fail {c[Status.failed]}"
            + (f" retry {c['retry']}" if c["retry"] else "")
        )
        self.bar.sync(detail)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _run_with_progress(run, target, quiet: bool, options, **kwargs) -> int:
    """Run a submit/resume (``options``: runner.sweep.RunOptions) with the progress bar, then
    print the outcome."""
    from orchestrator.runner.lifecycle import EXIT_INTERRUPTED

    progress = _Progress(quiet)
    name = target if isinstance(target, str) else target.name
    try:
        summary = run(
            target,
            options,
            on_start=progress.start,
            on_event=progress.event,
            note=lambda msg: err.print(msg, soft_wrap=True),
            **kwargs,
        )
    except KeyboardInterrupt:
        # A second Ctrl-C while the trials were stopping.
        progress.stop()
        err.print(escape(f"sweep {name}: interrupted; {_resume_hint(name, options.db)}"), soft_wrap=True)
        return EXIT_INTERRUPTED
    finally:
        progress.stop()
    return _finish(summary, quiet)


def _db_flag(db: str | None) -> str:
    """`` --db ARG`` that reaches the same database again when pasted into a shell (nothing
    when none was named: the same lookup finds it). A password in a URL is shown as ***."""
    if not db:
        return ""
    if "://" in db:
        import sqlalchemy as sa

        try:
            if sa.engine.make_url(db).password is not None:
                from orchestrator.store.engine import describe

                db = describe(db)
        except Exception:  # not a URL SQLAlchemy parses: shown as given
            pass
    return f" --db {shlex.quote(db)}"


def _resume_hint(name: str, db: str | None) -> str:
    return f"continue with `{prog()} resume {name}{_db_flag(db)}`"


# The hinted query's columns: a row of them fits a terminal (the params JSON does not).
QUERY_COLUMNS = "key, arm, lr, seed, status, final_step, ROUND(CAST(final_acc AS NUMERIC), 4) AS final_acc"


def query_hint(name: str, db: str | None) -> str:
    """The command that queries the sweep's final results in the database it ran in
    (sweep names are ``[A-Za-z0-9_.-]``, safe inside the quotes)."""
    return (
        f"{prog()} sql \"SELECT {QUERY_COLUMNS} FROM trial_final WHERE sweep = '{name}' ORDER BY arm, lr, seed\""
        f"{_db_flag(db)}"
    )


RESUME_LINES = 20  # interrupted trials listed one a line; the rest are counted


def resume_lines(resume_from: list[tuple[str, int | None]], late: int) -> list[str]:
    """What a stopped run says of its interrupted trials: where each one continues."""
    out = []
    for key, step in resume_from[:RESUME_LINES]:
        where = f"continues from step {step:,}" if step else "starts again from step 0 (no checkpoint yet)"
        out.append(f"  trial {key}: {where}")
    if len(resume_from) > RESUME_LINES:
        rest = resume_from[RESUME_LINES:]
        kept = sum(1 for _, s in rest if s)
        out.append(
            f"  ... and {len(rest)} more: {kept} continue from their checkpoints, {len(rest) - kept} start again"
        )
    if late:
        out.append(
            f"  {late} trial(s) did not checkpoint within the stop's grace ($ORCH_STOP_GRACE_S): "
            "they continue from their last checkpoint"
        )
    return out


def sweep_totals(summary) -> str:
    """The whole sweep's tally beside this driver's, where they differ (other drivers ran
    part of it, or it had finished trials before): ``(the sweep: 12 completed of 12)``."""
    counts = getattr(summary, "sweep_counts", None) or {}
    total = sum(counts.values())
    mine = sum(summary.outcomes.values())
    if not total or (mine == total and dict(summary.outcomes) == counts):
        return ""
    done = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return f" (the sweep: {done}; {total} trial{'' if total == 1 else 's'})"


def _finish(summary, quiet: bool) -> int:
    if summary.stopped is not None:
        from orchestrator.runner.lifecycle import EXIT_INTERRUPTED

        parts = ", ".join(f"{n} {k}" for k, n in sorted(summary.outcomes.items()))
        parts += sweep_totals(summary) if parts else ""
        for line in resume_lines(summary.resume_from, summary.late):
            err.print(escape(line), soft_wrap=True)
        err.print(
            escape(
                f"sweep {summary.sweep}: stopped ({summary.stopped}): {parts or 'nothing ran'}; "
                f"{_resume_hint(summary.sweep, summary.db_arg)}"
            ),
            soft_wrap=True,
        )
        return EXIT_INTERRUPTED
    parts = ", ".join(f"{n} {k}" for k, n in sorted(summary.outcomes.items())) or "nothing ran"
    parts += sweep_totals(summary)
    # The result, on stdout, --quiet or not: one line however long, the command inside it
    # copy-pasteable.
    out.print(
        escape(f"sweep {summary.sweep}: {parts}; query it with `{query_hint(summary.sweep, summary.db_arg)}`"),
        soft_wrap=True,
    )
    if not quiet:
        units = getattr(summary, "tune_trials", 0)
        if 0 < units < summary.ran:  # seed packs, or chains of short trials (runner/feed.py)
            err.print(f"{summary.ran} trials ran in {units} Ray Tune trials")
        for rec in getattr(summary, "looks", []):  # a sequential sweep: each look decided now
            st = ",".join(f"{k}={v}" for k, v in rec.stratum.items())
            err.print(
                f"look {rec.look}{' ' + st if st else ''}: n {rec.n}, z = {rec.statistic:.3f}, "
                f"boundary {rec.boundary:.3f}: {rec.decision}"
                + (f", {rec.seeds_saved} seed(s) saved" if rec.stopped else "")
            )
        if getattr(summary, "skipped", 0):
            err.print(
                f"{summary.skipped} trial(s) skipped (never run); see `{prog()} analyze {summary.sweep} sequential`"
            )
    if summary.failed:
        err.print(
            f"[red]{summary.failed} trial(s) failed[/red]: see `{prog()} status "
            f"{summary.sweep}` and the trials.error column"
        )
        return 1
    return 0


CHECKPOINT_DIR_HELP = "keep checkpoints as files in this folder instead of in the database"
ALLOW_CODE_CHANGE_HELP = (
    "continue a sweep whose attempts ran other code or another torch minor version (recorded with the spec versions)"
)
# The options submit, resume and join share, declared once so the three cannot drift apart.
# Sharing one is safe: help.py's polish writes the same help and metavar into it whichever
# command it reaches it through.
MAX_CONCURRENT = typer.Option(None, "--max-concurrent", min=1)
CHECKPOINT_DIR = typer.Option(None, "--checkpoint-dir", help=CHECKPOINT_DIR_HELP)
QUIET = typer.Option(False, "--quiet", "-q", help="no progress bar: only failures and the outcome line")
TAKEOVER = typer.Option(False, "--takeover", help="run even if another driver holds the sweep's lease")
ALLOW_CODE_CHANGE = typer.Option(False, "--allow-code-change", help=ALLOW_CODE_CHANGE_HELP)


@app.command()
def submit(
    spec: str = typer.Argument(..., help="sweep spec YAML (sweeps/*.yaml)"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    address: Optional[str] = typer.Option(None, "--address", help="join a running Ray cluster: auto or HOST:PORT"),
    max_concurrent: Optional[int] = MAX_CONCURRENT,
    checkpoint_dir: Optional[str] = CHECKPOINT_DIR,
    dry_run: bool = typer.Option(False, "--dry-run", help="print the expanded design and exit"),
    as_json: bool = typer.Option(False, "--json", help="with --dry-run: JSON output"),
    quiet: bool = QUIET,
    max_trials: int = typer.Option(100_000, "--max-trials", min=1, help="refuse a design with more trials than this"),
    takeover: bool = TAKEOVER,
    allow_code_change: bool = ALLOW_CODE_CHANGE,
    amend: bool = typer.Option(
        False,
        "--amend",
        "--yes",
        help="apply a changed design to an existing sweep (trials it no longer has become superseded; "
        "trials given more steps continue from their checkpoints; new tags are written in place)",
    ),
) -> int:
    """Run a sweep: expand the spec, record its trials, run the unfinished ones on Ray Tune."""
    from orchestrator import spec as specs

    sweep = specs.load(spec, max_trials=max_trials)
    from orchestrator.store.engine import resolve_url

    resolve_url(db, sweep.spec.storage)  # an empty or in-memory --db is refused, dry run or not
    for w in sweep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if dry_run:
        if address is None:
            # No cluster to ask: a `device: cuda` trial on a machine without CUDA fails in
            # its worker every time, so the dry run says so now.
            import torch

            from orchestrator.runner.sweep import check_devices

            check_devices(sweep.trials, float(torch.cuda.device_count()), "this machine")
        arms = [{k: r[k] for k in ("arm", "params", "state_elements", "mlp_hidden")} for r in sweep.matched]
        if as_json:
            doc: dict[str, Any] = {"trials": len(sweep.trials), "axes": sweep.axes}
            if arms:
                doc["arms"] = arms
            stored = _against_stored(sweep, db)
            if stored is not None:
                doc["against_stored"] = stored
            print(json.dumps(doc, default=str, allow_nan=False))
        else:
            out.print(f"sweep {escape(sweep.name)}: {len(sweep.trials)} trials")
            for name, values in sweep.axes.items():
                out.print(escape(f"  {name}: {', '.join(map(str, values))}"))
            if sweep.sequential is not None:
                q = sweep.sequential
                out.print(
                    escape(
                        f"  sequential: {q.test} on {q.compare.by} {q.compare.groups[0]} vs "
                        f"{q.compare.groups[1]}, looks {q.looks} seeds per group, alpha "
                        f"{q.alpha:g} ({q.spending})"
                        + (f", strata {', '.join(q.strata)} (Bonferroni)" if q.strata else "")
                    )
                )
            for r in arms:  # match_params: the harness size chosen per arm
                width = "unmatched" if r["mlp_hidden"] is None else f"mlp_hidden {r['mlp_hidden']}"
                out.print(
                    escape(f"  arm {r['arm']}: {r['params']:,} params, {r['state_elements']:,} state elements, {width}")
                )
            stored = _against_stored(sweep, db)
            if stored is not None:
                out.print(escape(f"  against the stored sweep: {stored}"))
        return 0
    from orchestrator.runner.sweep import RunOptions, submit as run_submit

    options = RunOptions(db, address, max_concurrent, checkpoint_dir, takeover, allow_code_change)
    return _run_with_progress(run_submit, sweep, quiet, options, amend=amend)


def _against_stored(sweep, db: str | None) -> str | None:
    """What submitting ``sweep`` would do to the stored sweep of that name (a dry run never
    creates or upgrades a database), or None when there is none to compare with."""
    from orchestrator.store import reader, repo
    from orchestrator.store.engine import open_store_engine

    try:
        engine, _ = open_store_engine(db, sweep.spec.storage, auto_create=False)
    except UserError:
        return None  # no database yet, or one this version would have to upgrade first
    try:
        with engine.connect() as conn:
            found = reader.find_sweep(conn, sweep.name)
            diff = repo.design_diff(conn, found[0], sweep.trials) if found is not None else None
    finally:
        engine.dispose()
    if diff is None or diff.first:
        return None
    refusal = diff.refusal()
    if refusal is not None:
        return f"refused: {refusal}"
    if not diff.changed:
        return "no change to its design"
    return f"{diff.summary()}; submit needs --amend"


@app.command()
def resume(
    sweep: str = typer.Argument(..., help="sweep name (see `orchestrator ls`)"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    address: Optional[str] = typer.Option(None, "--address"),
    max_concurrent: Optional[int] = MAX_CONCURRENT,
    checkpoint_dir: Optional[str] = CHECKPOINT_DIR,
    quiet: bool = QUIET,
    takeover: bool = TAKEOVER,
    allow_code_change: bool = ALLOW_CODE_CHANGE,
) -> int:
    """Run what a sweep has not finished; running, stale and interrupted trials continue
    from their checkpoints (on any machine that reaches the database)."""
    from orchestrator.runner.sweep import RunOptions, resume as run_resume

    options = RunOptions(db, address, max_concurrent, checkpoint_dir, takeover, allow_code_change)
    return _run_with_progress(run_resume, sweep, quiet, options)


@app.command()
def join(
    sweep: str = typer.Argument(..., help="sweep name (see `orchestrator ls`)"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    address: Optional[str] = typer.Option(None, "--address", help="a Ray cluster of this driver's: auto or HOST:PORT"),
    max_concurrent: Optional[int] = MAX_CONCURRENT,
    checkpoint_dir: Optional[str] = CHECKPOINT_DIR,
    quiet: bool = QUIET,
    allow_code_change: bool = ALLOW_CODE_CHANGE,
) -> int:
    """Add a driver to a submitted sweep: from any machine that reaches its database, with
    its own local Ray (or --address, its own cluster), it claims unfinished trials in
    batches beside the sweep's other drivers and runs them until none is left. A trial runs
    in one place at a time; a driver that dies leaves its trials to the others after
    $ORCH_LEASE_TTL_S seconds. `orchestrator cancel` stops every driver."""
    from orchestrator.runner.sweep import RunOptions, join as run_join

    options = RunOptions(db, address, max_concurrent, checkpoint_dir, False, allow_code_change)
    return _run_with_progress(run_join, sweep, quiet, options)


@app.command()
def status(
    sweep: Optional[str] = typer.Argument(None, help="sweep name; all sweeps when omitted"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    as_json: bool = typer.Option(False, "--json"),
    watch: bool = typer.Option(False, "--watch", "-w", help="redraw the bar and running-trials table until it ends"),
    interval: float = typer.Option(2.0, "--interval", min=0.2, help="seconds between redraws"),
    trial: Optional[str] = typer.Option(None, "--trial", help="one trial's row and its attempts (by key)"),
) -> int:
    """Counts by status, per-axis completion and an ETA (--watch: live, from the database);
    with --trial KEY, that trial and every attempt of it (where, which code, from which step)."""
    from orchestrator.store.engine import open_store_engine
    from orchestrator.store.progress import progress_report

    engine, _ = open_store_engine(db, auto_create=False)
    if trial is not None:
        if sweep is None:
            raise UserError("--trial needs a sweep name: orchestrator status SWEEP --trial KEY")
        return _trial_status(engine, sweep, trial, as_json)
    if watch:
        if sweep is None:
            raise UserError("--watch needs a sweep name: orchestrator status SWEEP --watch")
        _watch(engine, sweep, interval)
    report = progress_report(engine, sweep)
    if as_json:
        out.print_json(json.dumps(report, default=str))
        return 0
    from rich.table import Table

    for s in report["sweeps"]:
        counts = " ".join(f"{k} {v}" for k, v in s["counts"].items() if v)
        eta = f", ETA {s['eta_s'] / 60:.1f} min" if s.get("eta_s") else ""
        done = f", {100 * s['progress']:.0f}% of steps" if s.get("progress") is not None else ""
        # Stored values (names, parameter values, errors) are shown as stored, never as markup.
        noun = "trial" if s["total"] == 1 else "trials"
        out.print(f"[bold]{escape(str(s['sweep']))}[/bold]: {s['total']} {noun}: {escape(counts)}{done}{eta}")
        drivers = s.get("drivers") or []
        if drivers:
            out.print(f"  run by {len(drivers)} driver(s):")
            for d in drivers:
                out.print(
                    escape(
                        f"    {d['owner'][:8]} {d['command'] or ''} pid {d['pid']} on {d['host']}"
                        + (f" (SLURM {d['slurm_job']})" if d.get("slurm_job") else "")
                        + ": "
                        f"{d['claimed']} claimed, {d['running']} running, last heartbeat {d['heartbeat_at']}"
                    )
                )
        elif s.get("driver"):
            out.print(f"  run by {escape(str(s['driver']))}")
        if s["counts"].get(STALE):
            out.print(
                escape(
                    f"  {s['counts'][STALE]} stale trial(s): their driver stopped "
                    f"heartbeating; `{prog()} resume {s['sweep']}` re-runs them"
                )
            )
        if s["axes"]:
            table = Table(show_header=True, header_style="bold")
            for col in ("axis", "value", "done", "total"):
                table.add_column(col)
            for axis, rows in s["axes"].items():
                for r in rows:
                    table.add_row(escape(str(axis)), escape(str(r["value"])), str(r["done"]), str(r["total"]))
            out.print(table)
        sv = s.get("saved") or {}
        if sv.get("steps"):
            out.print(
                f"  compute saved: {sv['steps']:,} of {sv['of_steps']:,} training steps "
                f"({sv['skipped_trials']} trial(s) skipped by a sequential decision, "
                f"{sv['stopped_trials']} stopped after their escape)"
            )
        if s.get("stored"):
            from orchestrator.store.retention import size_line

            out.print(f"  {size_line(s['stored'])}")
        for f in s.get("failed", [])[:10]:
            out.print(f"  [red]failed[/red] {escape(str(f['key']))}: {escape(str(f['error']))}")
        envs = s.get("environments") or []
        if len(envs) > 1:
            out.print(f"  [yellow]ran with {len(envs)} code/torch versions[/yellow] (analyze ... --by code_version):")
        for e in envs:
            out.print(escape(f"  code {e['code_version']} with torch {e['torch_version']}: {e['trials']} trial(s)"))
    return 0


def _trial_status(engine, sweep: str, key: str, as_json: bool) -> int:
    """``status SWEEP --trial KEY``: the trial's stored row, then one line per attempt."""
    from orchestrator.store import reader

    with engine.connect() as conn:
        sid = reader.sweep_id(conn, sweep)
        row = reader.trial_row(conn, sid, key)
        if row is None:
            raise UserError(f'sweep {sweep!r} has no trial {key!r} (keys: orchestrator sql "SELECT key FROM trials")')
        tried = reader.trial_attempts(conn, row.id)
        samples = reader.system_metrics(conn, row.id)
    trial = {k: v for k, v in row._mapping.items() if k != "params"}
    rates = [x["steps_per_s"] for x in samples if x["steps_per_s"] is not None]
    system = {"last": samples[-1] if samples else None, "mean_steps_per_s": sum(rates) / len(rates) if rates else None}
    if as_json:
        out.print_json(
            json.dumps({"trial": trial, "params": row.params, "attempts": tried, "system": system}, default=str)
        )
        return 0
    out.print(
        escape(
            f"{sweep} {key}: {row.status}, step {row.final_step if row.final_step is not None else '-'}"
            f" of {row.steps}, final_acc {row.final_acc if row.final_acc is not None else '-'}"
        )
    )
    if row.error:
        out.print(escape(f"  error: {row.error}"))
    from rich.table import Table

    table = Table(show_header=True, header_style="bold")
    shown = (
        "attempt",
        "from_step",
        "outcome",
        "started_at",
        "ended_at",
        "host",
        "device",
        "precision",
        "code_version",
        "torch_version",
        "driver",
        "slurm_job",
    )
    for col in shown:
        table.add_column(col)
    for a in tried:
        table.add_row(*("" if a[c] is None else escape(str(a[c])) for c in shown))
    out.print(table if tried else "  no attempts recorded (it has not started, or ran before attempts were recorded)")
    last = system["last"]
    if last is not None:
        gpu = ""
        if last["gpu_util_pct"] is not None or last["gpu_mem_bytes"] is not None:
            util = "-" if last["gpu_util_pct"] is None else f"{last['gpu_util_pct']:.0f}%"
            mem = "-" if last["gpu_mem_bytes"] is None else f"{last['gpu_mem_bytes'] / 2**20:.0f} MiB"
            gpu = f", GPU {util} {mem}"
        cpu = "-" if last["cpu_pct"] is None else f"{last['cpu_pct']:.0f}%"
        rss = "-" if last["rss_bytes"] is None else f"{last['rss_bytes'] / 2**20:.0f} MiB"
        mean = system["mean_steps_per_s"]
        out.print(
            f"  system at step {last['step']}: CPU {cpu}, RSS {rss}{gpu}; "
            f"mean {'-' if mean is None else f'{mean:.1f}'} steps/s over {len(samples)} sample(s)"
        )
    return 0


def _watch(engine, sweep: str, interval: float) -> None:
    """Redraw the sweep's board from the database every ``interval`` seconds until no trial
    is pending or running (or Ctrl-C), its ETA from the recent rate of the steps read."""
    import time

    from orchestrator.cli.live_eta import RateBoard
    from orchestrator.eta import RateWindow
    from orchestrator.ui.live import BoardProgress, board_from_db, counts_detail

    window = RateWindow()
    board, st = board_from_db(engine, sweep)
    with BoardProgress(RateBoard.of(board, window), console=out, auto_refresh=False, transient=False) as bar:
        try:
            while True:
                bar.sync(counts_detail(st["counts"]))
                bar.refresh()
                if not (st["counts"].get(Status.running) or st["counts"].get(Status.pending)):
                    return
                time.sleep(interval)
                board, st = board_from_db(engine, sweep)
                bar.board = RateBoard.of(board, window)
        except KeyboardInterrupt:
            return


@app.command("ls")
def list_sweeps(
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP), as_json: bool = typer.Option(False, "--json")
) -> int:
    """Sweeps in a database."""
    from orchestrator.store.engine import open_store_engine
    from orchestrator.store.reader import sweep_list

    engine, _ = open_store_engine(db, auto_create=False)
    rows = sweep_list(engine)
    if as_json:
        out.print_json(json.dumps(rows, default=str))
        return 0
    for r in rows:
        stale = f", {r['stale']} stale" if r.get("stale") else ""
        out.print(escape(f"{r['name']}\t{r['completed'] or 0}/{r['trials']} completed{stale}\t{r['created_at']}"))
    return 0


@app.command()
def sql(
    query: str = typer.Argument(
        ..., help="one SELECT (or WITH/VALUES/EXPLAIN; SHOW/TABLE on PostgreSQL; a reading PRAGMA on SQLite)"
    ),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    as_csv: bool = typer.Option(False, "--csv", help="CSV on stdout"),
    as_json: bool = typer.Option(False, "--json", help="JSON list of row objects"),
    timeout: float = typer.Option(60.0, "--timeout", help="cancel the query (and its output) after this many seconds"),
    max_rows: int = typer.Option(100_000, "--max-rows", help="print at most this many rows (a note says when cut)"),
    max_bytes: int = typer.Option(64 * 2**20, "--max-bytes", help="print at most this many bytes of values"),
) -> int:
    """Read-only SQL on the result database (writes are refused, the DB is untouched).

    The statement is sent exactly as written; the connection is read-only (SQLite mode=ro
    and an authorizer, PostgreSQL a READ ONLY transaction as a role with a reader's rights:
    a superuser URL reads as the role `orchestrator db create-reader` made, or is refused).
    Fetching and printing both stop at --timeout."""
    import time

    from orchestrator.store.engine import resolve_url
    from orchestrator.store.readonly import readonly_query

    got = readonly_query(resolve_url(db), query, timeout_s=timeout, max_rows=max_rows, max_bytes=max_bytes)
    cols, rows = got.columns, got.rows

    def in_time(seq):
        # The rows are fetched; showing them must still end by the deadline.
        for i, r in enumerate(seq):
            if i % 256 == 0 and time.monotonic() > got.deadline:
                raise _output_cancelled(timeout, printed=i)
            yield r

    if as_csv:
        w = csv.writer(sys.stdout, lineterminator="\n")  # one line a row, as every shell tool reads it
        w.writerow(cols)
        for r in in_time(rows):
            w.writerow(r)
    elif as_json:
        print(json.dumps([dict(zip(cols, r)) for r in in_time(rows)], default=str))
    else:
        _print_table(cols, rows, got.deadline, timeout)
        err.print(f"{len(rows)} row(s)")
    if got.cut:
        limit = f"--max-rows {max_rows}" if got.cut == "max_rows" else f"--max-bytes {max_bytes}"
        err.print(escape(f"note: output stopped after {len(rows)} row(s) at {limit}; raise it to see more"))
    return 0


TABLE_CHUNK = 500  # rows drawn at a time: the --timeout is checked between chunks


def _output_cancelled(timeout: float, printed: int) -> Exception:
    """The one-line error of output stopped at ``--timeout``, with the rows really printed."""
    from orchestrator.errors import UserError

    return UserError(
        f"output cancelled after the {timeout:g} s timeout, {printed} row(s) printed (--timeout to change)"
    )


def _print_table(cols, rows, deadline: float, timeout: float) -> None:
    """``rows`` as a table, drawn a chunk of rows at a time with the columns' widths fixed
    from all of them (so the chunks line up as one table), stopping at the deadline: drawing
    100,000 rows takes rich tens of seconds. Cells are shown with control characters escaped."""
    import time

    from rich.cells import cell_len
    from rich.table import Column, Table

    from orchestrator.errors import printable

    names = [printable(str(c)) for c in cols]
    texts = []
    for i, r in enumerate(rows):
        # Nothing is printed until every row's width is known: a deadline passed here has
        # printed no row (in_time would count the rows prepared as printed).
        if i % 256 == 0 and time.monotonic() > deadline:
            raise _output_cancelled(timeout, printed=0)
        texts.append(["" if v is None else printable(_cell(v), keep="\n\t") for v in r])
    widths = [cell_len(n) for n in names]
    for r in texts:
        for i, t in enumerate(r):
            w = max(map(cell_len, t.split("\n"))) if "\n" in t else cell_len(t)
            if w > widths[i]:
                widths[i] = w
    for start in range(0, max(len(texts), 1), TABLE_CHUNK):
        if time.monotonic() > deadline:
            raise _output_cancelled(timeout, printed=start)
        table = Table(
            *(Column(escape(n), min_width=w, max_width=w) for n, w in zip(names, widths)),
            show_header=start == 0,
            header_style="bold",
            show_edge=False,
        )
        for r in texts[start : start + TABLE_CHUNK]:
            table.add_row(*(escape(t) for t in r))
        out.print(table)


def _cell(v: object, width: int = 1000) -> str:
    """A value as a table cell, long ones shortened (the CSV and JSON forms keep them whole)."""
    if isinstance(v, (str, bytes, bytearray)) and len(v) > width:
        return str(v[:width]) + f"... ({len(v):,} {'chars' if isinstance(v, str) else 'bytes'})"
    return str(v)
