"""The Python API: one entry point per thing a notebook or script does.

::

    from orchestrator import submit, resume, load, analyze, report, connect

    run = submit("sweeps/quickstart.yaml", db="runs/demo.db")   # a path, YAML text or a dict
    run.name, run.db, run.outcomes                              # sweep name, DB URL, counts
    trials, evals = load(run.db, run.name)                      # SQL column names, one per param
    analyze(run.db, run.name, "fisher").p_value                 # the stored analysis: block applies
    analyze(run.db, run.name, "lockin", by="arm", strata="lr")  # the options of `orchestrator analyze`
    report(run.db, run.name, out="runs/reports/demo").text()    # `orchestrator report`, as a Report
    engine = connect(run.db)                                    # a SQLAlchemy engine, for SQL

Everything is imported lazily (``import orchestrator`` stays light). Errors in what was
given (a bad spec, an unknown sweep, a missing database) are :class:`orchestrator.errors.
UserError` with a one-line message, the same the CLI prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from orchestrator.errors import UserError
from orchestrator.status import Status


@dataclass
class SweepRun:
    """What :func:`submit` / :func:`resume` return."""

    name: str
    db: str  # the database URL, as :func:`load` / :func:`analyze` / :func:`connect` take it
    total: int
    ran: int
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return self.outcomes.get(Status.failed, 0)

    def load(self):
        return load(self.db, self.name)

    def analyze(self, kind: str, **options: Any) -> Any:
        return analyze(self.db, self.name, kind, **options)


def _spec(spec: str | Path | dict[str, Any]):
    """A spec given as a path, YAML text or a mapping, loaded and validated."""
    from orchestrator import spec as specs

    if isinstance(spec, dict):
        import yaml

        return specs.load("<dict>", text=yaml.safe_dump(spec, sort_keys=False))
    if isinstance(spec, Path):
        return specs.load(spec)
    if not isinstance(spec, str):
        raise UserError(f"spec: expected a path, YAML text or a dict, got {type(spec).__name__}")
    # YAML text has a newline or a colon; a path has neither the first (and is usually a file).
    if "\n" not in spec and (Path(spec).is_file() or spec.endswith((".yaml", ".yml"))):
        return specs.load(spec)
    return specs.load("<text>", text=spec)


def _run(summary, url: str) -> SweepRun:
    return SweepRun(name=summary.sweep, db=url, total=summary.total, ran=summary.ran, outcomes=dict(summary.outcomes))


def submit(
    spec: str | Path | dict[str, Any],
    *,
    db: str | None = None,
    address: str | None = None,
    max_concurrent: int | None = None,
    checkpoint_dir: str | None = None,
) -> SweepRun:
    """Record the sweep and run its unfinished trials on Ray (``orchestrator submit``).

    ``db``: a URL or SQLite path; default the spec's ``storage:``, else ``$ORCH_DB``, else
    ``runs/orchestrator.db``. ``address``: join a running Ray cluster."""
    from orchestrator.runner.sweep import RunOptions, submit as run_submit
    from orchestrator.store.engine import resolve_url

    sweep = _spec(spec)
    url = resolve_url(db, sweep.spec.storage)  # refused (empty, in memory) before Ray starts
    return _run(
        run_submit(
            sweep, RunOptions(db=db, address=address, max_concurrent=max_concurrent, checkpoint_dir=checkpoint_dir)
        ),
        url,
    )


def resume(
    sweep: str,
    *,
    db: str | None = None,
    address: str | None = None,
    max_concurrent: int | None = None,
    checkpoint_dir: str | None = None,
) -> SweepRun:
    """Run what a recorded sweep has not finished (``orchestrator resume``)."""
    from orchestrator.runner.sweep import RunOptions, resume as run_resume
    from orchestrator.store.engine import resolve_url

    url = resolve_url(db)
    return _run(
        run_resume(
            sweep, RunOptions(db=db, address=address, max_concurrent=max_concurrent, checkpoint_dir=checkpoint_dir)
        ),
        url,
    )


def connect(db: str | Engine | None = None) -> Engine:
    """A SQLAlchemy engine on an existing result database (never creates one)."""
    from orchestrator.store.reader import open_engine

    return open_engine(db)


def load(db: str | Engine | None, sweep: str):
    """``trials, evals = load(db, sweep)``: every trial (any status) and eval point.

    ``trials``: ``trial_id, key, status, attempts, host, node_id, ..., final_acc, best_acc,
    error`` and one column per parameter under its dotted name (``arm``, ``lr``, ``task.K``).
    ``evals``: ``trial_id, step, acc, loss, train_loss, step_lr, elapsed_s`` and one
    ``metrics.<name>`` column per recorded metric. The returned object also carries
    ``.spec_text`` and ``.params``."""
    from orchestrator.store.reader import sweep_frames

    return sweep_frames(connect(db), sweep)


def analyze(db: str | Engine | None, sweep: str, kind: str, **options: Any) -> Any:
    """One analysis of a sweep, as ``orchestrator analyze SWEEP KIND`` runs it: ``lockin``,
    ``outcomes``, ``fisher``, ``permutation``, ``mcnemar``, ``km``, ``logrank``, ``hazard``,
    ``sequential`` or ``scaling``. The sweep's stored ``analysis:`` block is the base;
    ``options`` go over it under the names of the command's options (``by``, ``strata``,
    ``compare``, ``statuses``, ``lockin``, ``random_seed``, ...: the fields of
    :class:`orchestrator.analysis_config.AnalysisConfig`; an unknown name or a bad value is a
    :class:`UserError`; ``cells`` is the old name of ``strata``). The result has ``.summary``
    (a DataFrame) and ``.to_dict()``."""
    from orchestrator.analysis import pipeline
    from orchestrator.analysis.report import apply_horizon

    engine = connect(db)
    prep = apply_horizon(pipeline.prepare(engine, sweep, _stored_config(engine, sweep), **options))
    return pipeline.result(kind, pipeline.run(prep, kind))


def report(db: str | Engine | None, sweep: str, *, out: str | Path | None = None, format: str = "png", **options: Any):
    """The tables and the HTML report with figures, as ``orchestrator report SWEEP`` makes
    them: written under ``out`` (default ``runs/reports/SWEEP``) as ``format`` (``png`` or
    ``svg``), ``options`` over the stored ``analysis:`` block as in :func:`analyze`. The
    result has ``.text()`` (the printed tables), ``.to_dict()`` and ``.html_path``."""
    from orchestrator.analysis import pipeline
    from orchestrator.analysis.report import build_report

    engine = connect(db)
    prep = pipeline.prepare(engine, sweep, _stored_config(engine, sweep), **options)
    return build_report(prep, out, fmt=format, db=engine)


def _stored_config(engine: Engine, sweep: str):
    """The ``analysis:`` block stored with the sweep's spec, validated (the defaults without one)."""
    from orchestrator.analysis.stored import stored_spec
    from orchestrator.analysis_config import parse_config

    spec = stored_spec(engine, sweep)
    block = spec.get("analysis") if spec else None
    return parse_config(block if isinstance(block, dict) else None, source=f"{sweep}: analysis")


def register_cell(*args: Any, **kwargs: Any) -> Any:
    """Register a cell arm (see :func:`cells.registry.register_cell`)."""
    from cells.registry import register_cell as reg

    return reg(*args, **kwargs)


def register_task(*args: Any, **kwargs: Any) -> Any:
    """Register a task class (see :func:`tasks.registry.register_task`)."""
    from tasks.registry import register_task as reg

    return reg(*args, **kwargs)
