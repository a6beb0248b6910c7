"""What one driver run shares from its start to its end: the sweep, the database and the
lease (the driver session, also the one way the runner writes), the checkpoint folder and
the progress callbacks. Built once by ``submit``/``resume`` (runner/sweep.py) after the lease
is held; every function below them takes it plus only what is its own (a batch of trials)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the runner reaches the database only through orchestrator.store
    from orchestrator.runner.lifecycle import DriverSession
    from orchestrator.spec import SweepSpec
    from orchestrator.store.sweep_store import SweepStore


@dataclass(frozen=True)
class RunContext:
    spec: SweepSpec  # name, resources, retries, pack_seeds, the stop rule
    sweep_id: int
    session: DriverSession  # the lease, the stop flags, and ``session.write``
    url: str  # the database, resolved
    db_arg: str | None  # what ``--db`` reaches it again (the resume hint), None: the default lookup
    # Where the writer keeps checkpoints: None, the database (the default); else a folder
    # (``--checkpoint-dir``/``checkpoint_dir:``). ``checkpoint_reads``: the folders the loader
    # also looks in (that one, and the default beside the database where sweeps checkpointed
    # to files before revision 0007).
    checkpoint_folder: Path | None
    checkpoint_reads: list[Path]
    max_concurrent: int | None  # ``--max-concurrent``, else the spec's
    on_start: Callable[..., None] | None = None
    on_event: Callable[..., None] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def store(self) -> SweepStore:
        return self.session.store

    def stop_rule(self) -> dict[str, Any] | None:
        """The spec's ``stop:`` block as the trainable takes it."""
        return self.spec.stop.model_dump() if self.spec.stop else None
