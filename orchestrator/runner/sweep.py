"""Submit and resume: spec -> store rows -> Ray Tune -> store. The CLI is a thin shell over
these functions.

A run holds the sweep's lease for its whole life (runner/lifecycle.py): rows are written
only after the lease is claimed, so a second driver on the same sweep refuses before it
touches anything.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError
from orchestrator.runner import checkpoints
from orchestrator.runner.lifecycle import DriverSession
from orchestrator.spec import Sweep, SweepSpec, load
from orchestrator.status import Status
from orchestrator.store import reader, repo
from orchestrator.store.engine import describe, open_store_engine, resolve_url
from orchestrator.store.outage import DatabaseGone, DatabaseUnavailable


@dataclass
class RunSummary:
    sweep: str
    db: str
    total: int
    already_done: int
    ran: int
    outcomes: dict[str, int] = field(default_factory=dict)  # status -> trials
    skipped: int = 0  # sequential designs: seeds a decided contrast never ran
    looks: list[Any] = field(default_factory=list)  # design.sequential.LookRecord, this run's
    # Why the run stopped early (SIGINT, SIGTERM, a cancel, a lost lease); None: it ran out.
    stopped: str | None = None
    db_arg: str | None = None

    @property
    def failed(self) -> int:
        return self.outcomes.get(Status.failed.value, 0)

    @property
    def interrupted(self) -> int:
        return self.outcomes.get(Status.interrupted.value, 0)


def _checkpoint_root(url: str, spec: SweepSpec, override: str | None) -> Path:
    chosen = override or spec.checkpoint_dir
    return Path(chosen).expanduser().resolve() if chosen else checkpoints.default_root(url)


def check_devices(trials: list[tuple[str, dict[str, Any]]], gpus: float, where: str) -> None:
    """A trial asking for ``device: cuda`` where there is no GPU fails at once, every
    time: refuse it before anything is written (``where``: "this machine" or "the cluster")."""
    cuda = [k for k, p in trials if str(p.get("device", "")).startswith("cuda")]
    if cuda and gpus <= 0:
        raise UserError(f"{len(cuda)} trial(s) ask for device: cuda but {where} has no GPU (use device: cpu or auto)")


def _checkpoints(url: str, spec: SweepSpec, override: str | None, engine, sid: int) -> Path:
    """The sweep's checkpoint folder, with files named by pre-0005 keys renamed."""
    root = _checkpoint_root(url, spec, override)
    with engine.connect() as conn:
        renames = repo.key_renames(conn, sid)
    if renames:
        checkpoints.adopt_renamed(root, spec.name, renames)
    return root


def _check_design(diff: repo.DesignDiff, name: str, amend: bool, looked: bool = False) -> None:
    refusal = diff.refusal()
    if refusal is not None:
        raise UserError(f"sweep {name!r}: {refusal} (nothing was written)")
    if looked and diff.extended:
        raise UserError(
            f"sweep {name!r}: its sequential looks were decided at the old budget; a longer budget would change "
            "what they tested (submit the longer design under a new name; nothing was written)"
        )
    if diff.changed and not amend:
        raise UserError(
            f"sweep {name!r} exists with another design: {diff.summary()}; "
            "pass --amend (or --yes) to apply it (nothing was written)"
        )


def _unwrap_outage(exc: BaseException) -> DatabaseUnavailable | DatabaseGone | None:
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 10:
        if isinstance(cur, (DatabaseUnavailable, DatabaseGone)):
            return cur
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


def submit(
    sweep: Sweep,
    *,
    db: str | None = None,
    address: str | None = None,
    max_concurrent: int | None = None,
    checkpoint_dir: str | None = None,
    takeover: bool = False,
    amend: bool = False,
    on_start: Callable[..., None] | None = None,
    on_event: Callable[..., None] | None = None,
    note: Callable[[str], None] | None = None,
) -> RunSummary:
    """Record the sweep and its trials, then run every trial that is not finished.

    Re-submitting a sweep whose design changed (trials added or dropped, budgets, settings or
    tags changed) needs ``amend``: without it nothing is written and a UserError names the
    difference. With it the dropped trials become ``superseded``, trials given more steps
    continue from their checkpoints, and the spec is kept as a new version. A budget below
    what a trial has run is refused either way."""
    from orchestrator.runner.tune_runner import check_resources, cluster_limits, init_ray

    spec = sweep.spec
    # Before Ray starts or the database is made: every trial would fail at its first checkpoint.
    checkpoints.check_writable(_checkpoint_root(resolve_url(db, spec.storage), spec, checkpoint_dir) / spec.name)
    # What `--db` reaches this database again (the spec's storage: is not read by `sql`/`resume`).
    db = db or spec.storage or None
    started = init_ray(address)
    try:
        check_resources(spec.resources.cpu, spec.resources.gpu)
        check_devices(sweep.trials, cluster_limits()[1], "the Ray cluster")
        engine, url = open_store_engine(db, spec.storage)
        with engine.connect() as conn:
            found = reader.find_sweep(conn, spec.name)
            existing = found[0] if found is not None else None
            if existing is not None:  # refuse before the lease: nothing written at all
                looked = bool(repo.sequential_looks(conn, existing))
                _check_design(repo.design_diff(conn, existing, sweep.trials), spec.name, amend, looked)
        sid = repo.ensure_sweep(engine, spec.name, sweep.text, sweep.hash)
        with DriverSession(engine, sid, spec.name, takeover=takeover, note=note) as session:
            with engine.begin() as conn:
                diff = repo.design_diff(conn, sid, sweep.trials)
                # again, now that we hold the sweep
                _check_design(diff, spec.name, amend, bool(repo.sequential_looks(conn, sid)))
                version = repo.record_spec_version(conn, sid, sweep.text, sweep.hash)
                repo.upsert_sweep(conn, spec.name, sweep.text, sweep.hash)
                repo.apply_design(conn, sid, diff)
                ids = repo.add_trials(conn, sid, sweep.trials, spec_version=version)
                repo.release_unfinished(conn, sid)
                pending = {tid for tid, _, _ in repo.unfinished_trials(conn, sid)}
            if diff.changed and note is not None:
                note(f"sweep {spec.name}: amended to spec version {version}: {diff.summary()}")
            if sweep.sequential is not None:
                return _run_sequential(
                    sweep,
                    sid,
                    len(sweep.trials),
                    engine,
                    url,
                    max_concurrent,
                    checkpoint_dir,
                    on_start,
                    on_event,
                    session,
                    db,
                )
            to_run = [(ids[k], k, p) for k, p in sweep.trials if ids[k] in pending]
            return _run(
                spec,
                sid,
                to_run,
                len(sweep.trials),
                engine,
                url,
                max_concurrent,
                checkpoint_dir,
                on_start,
                on_event,
                session,
                db,
            )
    finally:
        if started:
            import ray

            ray.shutdown()


def resume(
    name: str,
    *,
    db: str | None = None,
    address: str | None = None,
    max_concurrent: int | None = None,
    checkpoint_dir: str | None = None,
    takeover: bool = False,
    on_start: Callable[..., None] | None = None,
    on_event: Callable[..., None] | None = None,
    note: Callable[[str], None] | None = None,
) -> RunSummary:
    """Run every trial of a recorded sweep that is not completed (running, stale and
    interrupted ones resume from their checkpoints). The spec is the one stored with the
    sweep."""
    from orchestrator.runner.tune_runner import check_resources, init_ray

    engine, url = open_store_engine(db, auto_create=False)
    with engine.connect() as conn:
        found = reader.find_sweep(conn, name)
    if found is None:
        raise UserError(f"no sweep named {name!r} in {describe(url)} (see `orchestrator ls`)")
    sid, spec_text = found
    # The design was accepted (and its size cap chosen) at submit: resume does not re-cap it.
    sweep = load(f"<sweep {name}>", text=spec_text, max_trials=sys.maxsize)
    spec = sweep.spec
    checkpoints.check_writable(_checkpoint_root(url, spec, checkpoint_dir) / spec.name)
    started = init_ray(address)
    try:
        check_resources(spec.resources.cpu, spec.resources.gpu)
        with DriverSession(engine, sid, spec.name, takeover=takeover, note=note) as session:
            with engine.begin() as conn:
                repo.release_unfinished(conn, sid)
                todo = repo.unfinished_trials(conn, sid)
                total = repo.count_trials(conn, sid)
            if sweep.sequential is not None:
                return _run_sequential(
                    sweep, sid, total, engine, url, max_concurrent, checkpoint_dir, on_start, on_event, session, db
                )
            return _run(
                spec, sid, todo, total, engine, url, max_concurrent, checkpoint_dir, on_start, on_event, session, db
            )
    finally:
        if started:
            import ray

            ray.shutdown()


def _run_batch(
    spec: SweepSpec,
    batch: list[tuple[int, str, dict[str, Any]]],
    engine,
    root: Path,
    max_concurrent: int | None,
    on_event,
    session: DriverSession,
) -> dict[int, str]:
    """Run trials on Ray Tune under the driver session; a database outage that outlasted
    the writer's retries stops the session and surfaces as DatabaseUnavailable, a database
    that is gone (file deleted or replaced, tables dropped) as DatabaseGone."""
    from orchestrator.runner.tune_runner import run_trials

    try:
        outcomes = run_trials(
            spec.name,
            batch,
            engine=engine,
            checkpoint_root=root,
            cpu=spec.resources.cpu,
            gpu=spec.resources.gpu,
            max_concurrent=max_concurrent or spec.max_concurrent,
            retries=spec.retries,
            pack_seeds=spec.pack_seeds,
            on_event=on_event,
            stop=spec.stop.model_dump() if spec.stop else None,
            session=session,
        )
    except Exception as exc:
        if session.fatal is not None:
            raise session.fatal from None
        outage = _unwrap_outage(exc)
        if outage is None:
            raise
        if isinstance(outage, DatabaseGone):
            session.fail(outage)
        else:
            session.stop("database unreachable")
        raise outage from None
    if session.fatal is not None:  # found by the lease thread: Tune stopped the trials
        raise session.fatal from None
    return outcomes


def _run(
    spec: SweepSpec,
    sid: int,
    to_run: list[tuple[int, str, dict[str, Any]]],
    total: int,
    engine,
    url: str,
    max_concurrent: int | None,
    checkpoint_dir: str | None,
    on_start,
    on_event,
    session: DriverSession,
    db: str | None,
) -> RunSummary:

    root = _checkpoints(url, spec, checkpoint_dir, engine, sid)
    if on_start:
        on_start(describe(url), total, len(to_run), steps=sum(int(p.get("steps") or 0) for _, _, p in to_run))
    outcomes = _run_batch(spec, to_run, engine, root, max_concurrent, on_event, session)
    counts = Counter(outcomes.values())
    if session.stop_reason is not None:
        # Tune may end before telling the writer about every stopped trial: the database
        # (after marking what is still running as interrupted) has the true tally.
        with engine.begin() as conn:
            session.interrupt_running(conn)
            counts = Counter(repo.statuses(conn, [tid for tid, _, _ in to_run]))
    return RunSummary(
        sweep=spec.name,
        db=describe(url),
        total=total,
        already_done=total - len(to_run),
        ran=len(to_run),
        outcomes=dict(counts),
        stopped=session.stop_reason,
        db_arg=db,
    )


class _LookStopped(Exception):
    """The driver session stopped during a look: no decision on its partial data."""


def _run_sequential(
    sweep: Sweep,
    sid: int,
    total: int,
    engine,
    url: str,
    max_concurrent: int | None,
    checkpoint_dir: str | None,
    on_start,
    on_event,
    session: DriverSession,
    db: str | None,
) -> RunSummary:
    """A sweep with a ``sequential:`` block runs look by look (runner/sequential.py)."""
    from orchestrator.runner.sequential import drive

    spec = sweep.spec
    root = _checkpoints(url, spec, checkpoint_dir, engine, sid)
    with engine.connect() as conn:
        todo = repo.unfinished_trials(conn, sid)
    pending = len(todo)
    if on_start:
        on_start(describe(url), total, pending, steps=sum(int(p.get("steps") or 0) for _, _, p in todo))

    def run(batch: list[tuple[int, str, dict[str, Any]]]) -> dict[int, str]:
        out = _run_batch(spec, batch, engine, root, max_concurrent, on_event, session)
        if session.stop_reason is not None:
            raise _LookStopped  # a look cut short is never tested
        return out

    try:
        res = drive(sweep.sequential, sweep.axes, sweep.thresholds, sid, engine, run)
    except _LookStopped:
        with engine.begin() as conn:
            session.interrupt_running(conn)
            counts = Counter(repo.statuses(conn, [tid for tid, _, _ in todo]))
        return RunSummary(
            sweep=spec.name,
            db=describe(url),
            total=total,
            already_done=total - pending,
            ran=pending,
            outcomes=dict(counts),
            stopped=session.stop_reason,
            db_arg=db,
        )
    return RunSummary(
        sweep=spec.name,
        db=describe(url),
        total=total,
        already_done=total - pending,
        ran=res.ran,
        outcomes=res.outcomes,
        skipped=res.skipped,
        looks=res.records,
        stopped=session.stop_reason,
        db_arg=db,
    )
