"""Submit and resume: spec -> store rows -> Ray Tune -> store. The CLI is a thin shell over
these functions."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError
from orchestrator.runner import checkpoints
from orchestrator.spec import Sweep, SweepSpec, load
from orchestrator.status import Status
from orchestrator.store import repo
from orchestrator.store.engine import describe, open_store_engine


@dataclass
class RunSummary:
    sweep: str
    db: str
    total: int
    already_done: int
    ran: int
    outcomes: dict[str, int] = field(default_factory=dict)
    skipped: int = 0  # sequential designs: seeds a decided contrast never ran
    looks: list[Any] = field(default_factory=list)  # design.sequential.LookRecord, this run's

    @property
    def failed(self) -> int:
        return self.outcomes.get(Status.failed.value, 0)


def _checkpoint_root(url: str, spec: SweepSpec, override: str | None) -> Path:
    chosen = override or spec.checkpoint_dir
    return Path(chosen).expanduser().resolve() if chosen else checkpoints.default_root(url)


def submit(sweep: Sweep, *, db: str | None = None, address: str | None = None,
           max_concurrent: int | None = None, checkpoint_dir: str | None = None,
           on_start: Callable[..., None] | None = None,
           on_event: Callable[..., None] | None = None) -> RunSummary:
    """Record the sweep and its trials, then run every trial that is not finished."""
    from orchestrator.runner.tune_runner import check_resources, init_ray

    spec = sweep.spec
    started = init_ray(address)
    try:
        check_resources(spec.resources.cpu, spec.resources.gpu)
        engine, url = open_store_engine(db, spec.storage)
        with engine.begin() as conn:
            sid = repo.upsert_sweep(conn, spec.name, sweep.text, sweep.hash)
            ids = repo.add_trials(conn, sid, sweep.trials)
            repo.release_unfinished(conn, sid)
            pending = {tid for tid, _, _ in repo.unfinished_trials(conn, sid)}
        if sweep.sequential is not None:
            return _run_sequential(sweep, sid, len(sweep.trials), engine, url, max_concurrent,
                                   checkpoint_dir, on_start, on_event)
        to_run = [(ids[k], k, p) for k, p in sweep.trials if ids[k] in pending]
        return _run(spec, sid, to_run, len(sweep.trials), engine, url, max_concurrent,
                    checkpoint_dir, on_start, on_event)
    finally:
        if started:
            import ray

            ray.shutdown()


def resume(name: str, *, db: str | None = None, address: str | None = None,
           max_concurrent: int | None = None, checkpoint_dir: str | None = None,
           on_start: Callable[..., None] | None = None,
           on_event: Callable[..., None] | None = None) -> RunSummary:
    """Run every trial of a recorded sweep that is not completed (running ones resume from
    their checkpoints). The spec is the one stored with the sweep."""
    from orchestrator.runner.tune_runner import check_resources, init_ray

    engine, url = open_store_engine(db, auto_create=False)
    with engine.connect() as conn:
        found = repo.find_sweep(conn, name)
    if found is None:
        raise UserError(f"no sweep named {name!r} in {describe(url)} (see `orchestrator ls`)")
    sid, spec_text = found
    sweep = load(f"<sweep {name}>", text=spec_text)
    spec = sweep.spec
    started = init_ray(address)
    try:
        check_resources(spec.resources.cpu, spec.resources.gpu)
        with engine.begin() as conn:
            repo.release_unfinished(conn, sid)
            todo = repo.unfinished_trials(conn, sid)
            total = repo.count_trials(conn, sid)
        if sweep.sequential is not None:
            return _run_sequential(sweep, sid, total, engine, url, max_concurrent,
                                   checkpoint_dir, on_start, on_event)
        return _run(spec, sid, todo, total, engine, url, max_concurrent, checkpoint_dir,
                    on_start, on_event)
    finally:
        if started:
            import ray

            ray.shutdown()


def _run(spec: SweepSpec, sid: int, to_run: list[tuple[int, str, dict[str, Any]]], total: int,
         engine, url: str, max_concurrent: int | None, checkpoint_dir: str | None,
         on_start, on_event) -> RunSummary:
    from orchestrator.runner.tune_runner import run_trials

    root = _checkpoint_root(url, spec, checkpoint_dir)
    if on_start:
        on_start(describe(url), total, len(to_run),
                 steps=sum(int(p.get("steps") or 0) for _, _, p in to_run))
    outcomes = run_trials(
        spec.name, to_run, engine=engine, checkpoint_root=root, cpu=spec.resources.cpu,
        gpu=spec.resources.gpu, max_concurrent=max_concurrent or spec.max_concurrent,
        retries=spec.retries, pack_seeds=spec.pack_seeds, on_event=on_event,
            stop=spec.stop.model_dump() if spec.stop else None)
    counts = Counter(outcomes.values())
    return RunSummary(sweep=spec.name, db=describe(url), total=total,
                      already_done=total - len(to_run), ran=len(to_run), outcomes=dict(counts))


def _run_sequential(sweep: Sweep, sid: int, total: int, engine, url: str,
                    max_concurrent: int | None, checkpoint_dir: str | None,
                    on_start, on_event) -> RunSummary:
    """A sweep with a ``sequential:`` block runs look by look (runner/sequential.py)."""
    from orchestrator.runner.sequential import drive
    from orchestrator.runner.tune_runner import run_trials

    spec = sweep.spec
    root = _checkpoint_root(url, spec, checkpoint_dir)
    with engine.connect() as conn:
        pending = len(repo.unfinished_trials(conn, sid))
    if on_start:
        on_start(describe(url), total, pending)

    def run(batch: list[tuple[int, str, dict[str, Any]]]) -> dict[int, str]:
        return run_trials(
            spec.name, batch, engine=engine, checkpoint_root=root, cpu=spec.resources.cpu,
            gpu=spec.resources.gpu, max_concurrent=max_concurrent or spec.max_concurrent,
            retries=spec.retries, pack_seeds=spec.pack_seeds, on_event=on_event,
            stop=spec.stop.model_dump() if spec.stop else None)

    res = drive(sweep.sequential, sweep.axes, sweep.thresholds, sid, engine, run)
    return RunSummary(sweep=spec.name, db=describe(url), total=total,
                      already_done=total - pending, ran=res.ran, outcomes=res.outcomes,
                      skipped=res.skipped, looks=res.records)
