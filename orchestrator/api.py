"""The Python API: one entry point per thing a notebook or script does, each named and
shaped like its command: the sweep first, the database as the keyword ``db=``, every other
option under the name of the command's option (``--max-concurrent`` is ``max_concurrent=``).

::

    from orchestrator import submit, resume, load, analyze, report, export, connect

    run = submit("sweeps/quickstart.yaml", db="runs/demo.db")   # a path, YAML text or a dict
    run.name, run.db, run.outcomes                              # sweep name, DB URL, counts
    trials, evals = load(run.name, db=run.db)                   # SQL column names, one per param
    analyze(run.name, "fisher", db=run.db).p_value              # the stored analysis: block applies
    analyze(run.name, "lockin", db=run.db, by="arm", strata="lr")  # the options of `orchestrator analyze`
    report(run.name, db=run.db, out="runs/reports/demo").text()    # `orchestrator report`, as a Report
    export(run.name, db=run.db, out="exports/demo")             # `orchestrator export`: the files written
    engine = connect(run.db)                                    # a SQLAlchemy engine, for SQL

Everything is imported lazily (``import orchestrator`` stays light). Errors in what was
given (a bad spec, an unknown sweep, a missing database) are :class:`orchestrator.errors.
UserError` with a one-line message, the same the CLI prints. The old order of ``load``,
``analyze`` and ``report`` (``load(db, sweep)``) still works, with a ``DeprecationWarning``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from orchestrator.errors import UserError
from orchestrator.status import Status

if TYPE_CHECKING:
    from cells import ArmSpec, Family
    from tasks import Task


@dataclass
class SweepRun:
    """What :func:`submit` / :func:`resume` return: the sweep's ``name``, its database URL
    ``db`` (as :func:`load`, :func:`analyze` and :func:`connect` take it), ``total`` trials
    in the sweep, ``ran`` (how many this call ran) and ``outcomes`` (status -> trials of
    this call, e.g. ``{"completed": 8}``)."""

    name: str
    db: str  # the database URL, as :func:`load` / :func:`analyze` / :func:`connect` take it
    total: int
    ran: int
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        """How many trials of this call failed."""
        return self.outcomes.get(Status.failed, 0)

    def load(self) -> Any:
        """:func:`load` of this sweep: ``trials, evals``."""
        return load(self.name, db=self.db)

    def analyze(self, kind: str, **options: Any) -> Any:
        """:func:`analyze` of this sweep."""
        return analyze(self.name, kind, db=self.db, **options)


def _spec(spec: str | Path | dict[str, Any], max_trials: int):
    """A spec given as a path, YAML text or a mapping, loaded and validated."""
    from orchestrator import spec as specs

    if isinstance(spec, dict):
        import yaml

        return specs.load("<dict>", text=yaml.safe_dump(spec, sort_keys=False), max_trials=max_trials)
    if isinstance(spec, Path):
        return specs.load(spec, max_trials=max_trials)
    if not isinstance(spec, str):
        raise UserError(f"spec: expected a path, YAML text or a dict, got {type(spec).__name__}")
    # YAML text has a newline or a colon; a path has neither the first (and is usually a file).
    if "\n" not in spec and (Path(spec).is_file() or spec.endswith((".yaml", ".yml"))):
        return specs.load(spec, max_trials=max_trials)
    return specs.load("<text>", text=spec, max_trials=max_trials)


def _run(summary, url: str) -> SweepRun:
    return SweepRun(name=summary.sweep, db=url, total=summary.total, ran=summary.ran, outcomes=dict(summary.outcomes))


def submit(
    spec: str | Path | dict[str, Any],
    *,
    db: str | None = None,
    address: str | None = None,
    max_concurrent: int | None = None,
    checkpoint_dir: str | None = None,
    max_trials: int = 100_000,
    takeover: bool = False,
    amend: bool = False,
    allow_code_change: bool = False,
) -> SweepRun:
    """Record the sweep and run its unfinished trials on Ray (``orchestrator submit``).

    Takes ``spec``: a path to a YAML file, YAML text, or a dict of the same shape
    (``{"name": ..., "fixed": {...}, "axes": {...}, "budget": {...}}``); ``db``: a URL or
    SQLite path (default the spec's ``storage:``, else ``$ORCH_DB``, else
    ``runs/orchestrator.db``); ``address``: a Ray cluster to join (``auto`` or
    ``HOST:PORT``; default a local Ray); ``max_concurrent``: trials at once (default the
    spec's); ``checkpoint_dir``: keep checkpoints as files in this folder (on the driver's
    machine) instead of in the database; ``max_trials``: refuse a larger design;
    ``takeover``: run even if another driver holds the sweep's lease; ``amend``: apply a
    changed design to the stored sweep; ``allow_code_change``: continue a sweep whose
    attempts ran other code or another torch minor version (recorded).

    Returns a :class:`SweepRun` (name, database URL, trial counts, outcomes) once every
    trial has ended. Raises :class:`~orchestrator.errors.UserError` for a bad spec or
    database, before anything runs."""
    from orchestrator.runner.sweep import RunOptions, submit as run_submit
    from orchestrator.store.engine import resolve_url

    sweep = _spec(spec, max_trials)
    url = resolve_url(db, sweep.spec.storage)  # refused (empty, in memory) before Ray starts
    options = RunOptions(db, address, max_concurrent, checkpoint_dir, takeover, allow_code_change)
    return _run(run_submit(sweep, options, amend=amend), url)


def resume(
    sweep: str,
    *,
    db: str | None = None,
    address: str | None = None,
    max_concurrent: int | None = None,
    checkpoint_dir: str | None = None,
    takeover: bool = False,
    allow_code_change: bool = False,
) -> SweepRun:
    """Run what a recorded sweep has not finished (``orchestrator resume``): running, stale
    and interrupted trials continue from their checkpoints, with the spec stored with it.

    Takes the sweep's name and the options of :func:`submit` that apply (``db``,
    ``address``, ``max_concurrent``, ``checkpoint_dir``, ``takeover``,
    ``allow_code_change``). Returns a
    :class:`SweepRun`; an unknown sweep is a :class:`~orchestrator.errors.UserError`."""
    from orchestrator.runner.sweep import RunOptions, resume as run_resume
    from orchestrator.store.engine import resolve_url

    url = resolve_url(db)
    options = RunOptions(db, address, max_concurrent, checkpoint_dir, takeover, allow_code_change)
    return _run(run_resume(sweep, options), url)


def join(
    sweep: str,
    *,
    db: str | None = None,
    address: str | None = None,
    max_concurrent: int | None = None,
    checkpoint_dir: str | None = None,
    allow_code_change: bool = False,
) -> SweepRun:
    """One more driver on a submitted sweep (``orchestrator join``): from any machine that
    reaches its database, with a local Ray (or the cluster at ``address``), it claims the
    sweep's unfinished trials in batches beside its other drivers and runs them until none
    is left; a trial runs in one place at a time.

    Takes the sweep's name and ``db``, ``address``, ``max_concurrent``, ``checkpoint_dir``
    and ``allow_code_change`` as :func:`submit` does. Returns a :class:`SweepRun` (``ran``:
    the trials this driver ran); an unknown sweep is a :class:`~orchestrator.errors.UserError`.
    A ``sequential:`` design is shared look by look: whichever driver first finds a look
    complete decides it, once."""
    from orchestrator.runner.sweep import RunOptions, join as run_join
    from orchestrator.store.engine import resolve_url

    url = resolve_url(db)
    # No takeover: a joining driver runs beside the sweep's other drivers, never instead of them.
    options = RunOptions(db, address, max_concurrent, checkpoint_dir, False, allow_code_change)
    return _run(run_join(sweep, options), url)


def connect(db: str | Engine | None = None) -> Engine:
    """A SQLAlchemy engine on an existing result database (never creates one).

    Takes a URL, a SQLite path or an engine (returned as it is); ``None`` is ``$ORCH_DB``,
    else ``runs/orchestrator.db``. A missing database is a
    :class:`~orchestrator.errors.UserError`."""
    from orchestrator.store.reader import open_engine

    return open_engine(db)


def load(sweep: str, *, db: str | Engine | None = None) -> Any:
    """``trials, evals = load(sweep, db=URL)``: every trial (any status) and eval point.

    Takes the sweep's name and ``db`` (a URL, SQLite path or engine; see :func:`connect`).
    Returns a pair of pandas DataFrames (it unpacks as one; the object also carries
    ``.spec_text``, the stored spec, and ``.params``, the parameter names).
    ``trials``: ``trial_id, key, status, attempts, ..., final_acc, best_acc, error``, where
    the trial ran as ``placement_host``, ``placement_node_id``, ``placement_device``, and
    one column per parameter under its dotted name (``arm``, ``lr``, ``task.K``,
    ``device``). ``evals``: ``trial_id, step, acc, loss, train_loss, step_lr, elapsed_s``
    and one ``metrics.<name>`` column per recorded metric. An unknown sweep is a
    :class:`~orchestrator.errors.UserError` naming the sweeps there are."""
    from orchestrator.store.reader import sweep_frames

    return sweep_frames(connect(db), sweep)


def analyze(sweep: str, kind: str, *, db: str | Engine | None = None, **options: Any) -> Any:
    """One analysis of a sweep, as ``orchestrator analyze SWEEP KIND`` runs it.

    Takes the sweep's name, ``kind`` (``lockin``, ``outcomes``, ``fisher``, ``permutation``,
    ``mcnemar``, ``km``, ``logrank``, ``hazard``, ``sequential`` or ``scaling``), ``db``
    (see :func:`connect`) and ``options`` over the sweep's stored ``analysis:`` block, under
    the names of the command's options (``by``, ``strata``, ``compare``, ``statuses``,
    ``lockin``, ``random_seed``, ...: the fields of
    :class:`orchestrator.analysis_config.AnalysisConfig`; ``cells`` is the old name of
    ``strata``). Returns the analysis' result: ``.summary`` (a DataFrame), ``.to_dict()``
    and the statistic's own fields (e.g. ``.p_value``). An unknown name or a bad value is a
    :class:`~orchestrator.errors.UserError`."""
    from orchestrator.analysis import pipeline

    _, prep = _prepared(sweep, db, options)
    return pipeline.result(kind, pipeline.run(prep, kind))


def report(
    sweep: str,
    *,
    db: str | Engine | None = None,
    out: str | Path | None = None,
    format: str = "png",
    **options: Any,
) -> Any:
    """The tables and the HTML report with figures, as ``orchestrator report SWEEP`` makes them.

    Takes the sweep's name, ``db`` (see :func:`connect`), ``out`` (the folder; default
    ``runs/reports/SWEEP``), ``format`` (``png`` or ``svg`` figures) and ``options`` over the
    stored ``analysis:`` block as in :func:`analyze`. Returns a report object:
    ``.text()`` (the printed tables), ``.to_dict()`` and ``.html_path``."""
    from orchestrator.analysis.report import build_report

    engine, prep = _prepared(sweep, db, options)
    return build_report(prep, out, fmt=format, db=engine)


def export(sweep: str, *, db: str | Engine | None = None, out: str | Path, format: str = "parquet") -> list[Path]:
    """A sweep as files any tool reads, as ``orchestrator export SWEEP --out DIR`` writes them.

    Takes the sweep's name, ``db`` (see :func:`connect`), ``out`` (a folder, created if
    missing) and ``format`` (``parquet`` or ``csv``). Writes ``trials.<format>`` (the
    ``trials`` frame of :func:`load`), ``evals.<format>`` and ``spec.yaml``.

    Returns the paths written."""
    from orchestrator.store.export import export_sweep

    return export_sweep(connect(db), sweep, format, out)


def _prepared(sweep: str, db: str | Engine | None, options: dict[str, Any]):
    """The engine and the prepared data of analyze and report: the stored ``analysis:``
    block under the caller's options."""
    from orchestrator.analysis import pipeline

    engine = connect(db)
    return engine, pipeline.prepare(engine, sweep, _stored_config(engine, sweep), **options)


def _stored_config(engine: Engine, sweep: str):
    """The ``analysis:`` block stored with the sweep's spec, validated (the defaults without one)."""
    from orchestrator.analysis.stored import stored_spec
    from orchestrator.analysis_config import parse_config

    spec = stored_spec(engine, sweep)
    block = spec.get("analysis") if spec else None
    return parse_config(block if isinstance(block, dict) else None, source=f"{sweep}: analysis")


def register_cell(arm: ArmSpec, family: Family | None = None) -> ArmSpec:
    """Register a cell arm from a plugin: takes its :class:`cells.ArmSpec` and, for a new
    family, its :class:`cells.Family`; returns the arm (see
    :func:`cells.registry.register_cell`)."""
    from cells.registry import register_cell as reg

    return reg(arm, family)


def register_task(cls: type[Task]) -> type[Task]:
    """Register a task class from a plugin (usable as a class decorator): takes a
    :class:`tasks.Task` subclass with a unique ``name`` and returns it (see
    :func:`tasks.registry.register_task`)."""
    from tasks.registry import register_task as reg

    return reg(cls)
