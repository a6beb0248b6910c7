"""Where a trial's checkpoint lives, and how a unit gets it back.

By default a checkpoint lives in the sweep's database (``trial_checkpoints``): the unit sends
it to the driver in a report and the driver's writer stores it in the transaction that
stores the eval rows it covers, so any machine that reaches the database can continue the
sweep. With ``--checkpoint-dir DIR`` (or ``checkpoint_dir:`` in the spec) the writer keeps
them as files named by the trial's stable key instead, written atomically (temp file +
rename) after the rows they cover are stored; a sweep checkpointed to files before revision
0007 keeps resuming from them.

Either way the files and the database are read on the driver's machine: a unit asks the
:class:`Loader` actor, which runs beside the driver, for its members' checkpoints. No node
needs shared storage. A checkpoint holds no trace: the loader reads the trial's eval rows up
to the checkpoint's step with it, and the unit resumes with those (``Found.trace``).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError

# The store (SQLAlchemy and the models) is imported where the Loader and the driver use it,
# not here: every trial's Ray worker imports this module for fetch and StopPoll, and the
# store's import cost each worker ~0.5 CPU-s it never used. torch too is imported where a
# state is (de)serialized: the Loader's worker imports this module to run, and torch cost
# it ~1.3 CPU-s at every driver's start for bytes it only passes on.

DATABASE = "database"
FILE = "file"


def default_root(db_url: str) -> Path:
    """Beside a SQLite file (``runs/orchestrator.db`` -> ``runs/checkpoints``); for
    PostgreSQL, ``runs/checkpoints/<hash of the URL>`` under the working directory, so two
    databases never share a sweep's checkpoints."""
    from orchestrator.store.engine import sqlite_path

    path = sqlite_path(db_url)
    if path is not None:
        return (path.parent / "checkpoints").resolve()
    tag = hashlib.sha256(db_url.encode()).hexdigest()[:12]
    return (Path("runs") / "checkpoints" / tag).resolve()


def check_writable(folder: Path) -> None:
    """Refuse (UserError) a checkpoint folder that cannot be written: a file, a path under a
    file, a read-only or otherwise refusing directory. Checked by writing a probe file before
    any trial starts, since every trial would otherwise train to its first checkpoint and
    fail there; folders made for the probe are removed again."""
    folder = Path(folder)
    made: list[Path] = []
    cur = folder
    while not cur.exists() and not cur.is_symlink() and cur != cur.parent:
        made.append(cur)
        cur = cur.parent
    hint = "choose another with --checkpoint-dir DIR or checkpoint_dir: in the spec; nothing was written"
    if not cur.is_dir():
        raise UserError(f"checkpoint folder {folder}: {cur} is not a folder ({hint})")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"checkpoint folder {folder} is not writable: {exc.strerror or exc} ({hint})") from None
    finally:
        for d in made:  # deepest first
            try:
                d.rmdir()
            except OSError:
                break


def trial_path(root: Path, sweep: str, key: str) -> Path:
    return Path(root) / sweep / f"{key}.pt"


def adopt_renamed(root: Path, sweep: str, renames: list[tuple[str, str]]) -> int:
    """Give checkpoints written under a trial's old key (before migration 0005_identity
    re-keyed it) their trial's key. Idempotent; returns how many files it renamed."""
    moved = 0
    for old, new in renames:
        src, dst = trial_path(root, sweep, old), trial_path(root, sweep, new)
        if src.exists() and not dst.exists():
            os.replace(src, dst)
            moved += 1
    return moved


def serialize(state: dict[str, Any]) -> bytes:
    """A ``Trainer.state_dict`` as the bytes a checkpoint stores."""
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def deserialize(data: bytes) -> dict[str, Any]:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def save(path: Path, state: dict[str, Any] | bytes) -> None:
    """Write a checkpoint file atomically (a state, or its serialized bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            if isinstance(state, bytes):
                fh.write(state)
            else:
                import torch

                torch.save(state, fh)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """The state saved at ``path`` (None when there is no file)."""
    if not path.exists():
        return None
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


@dataclass(frozen=True)
class Found:
    """A member's checkpoint as the loader found it."""

    state: bytes
    step: int
    origin: str  # DATABASE or FILE
    # The stored eval rows up to ``step`` (``EvalPoint.to_dict`` mappings): the trace a
    # checkpoint without one resumes with (``Trainer.load_state_dict``).
    trace: tuple[dict[str, Any], ...] = ()


class Loader:
    """Runs as a Ray actor on the driver's node (:func:`start_loader`): gives a unit its
    members' checkpoints, from the database or from files on the driver's machine, whichever
    is further along."""

    def __init__(self, url: str, sweep: str, folders: list[str]) -> None:
        from orchestrator.store.sweep_store import SweepStore

        self.store = SweepStore.at(url)
        self.sweep = sweep
        self.folders = [Path(f) for f in folders]
        self._stopping = False

    # The driver is stopping (Ctrl-C, SIGTERM, a cancel, a lost lease): units checkpoint
    # where they are and end (StopPoll), so an interrupted trial continues from its step.
    def request_stop(self) -> None:
        self._stopping = True

    def stopping(self) -> bool:
        return self._stopping

    def chain(self, owner: str, members: list[tuple[int, str]]) -> dict[int, Found | None]:
        """A chain's members (trial id, key) that ``owner`` still holds
        (store.claims.still_held), each with its checkpoint (:meth:`load`): one round trip
        for the whole chain at its start, not one per member."""
        from orchestrator.store import claims

        held = self.store.read(lambda conn: claims.still_held(conn, owner, [t for t, _ in members]), budget_s=None)
        keys = dict(members)
        return {t: self.load(t, keys[t]) for t in held}

    def load(self, trial_id: int, key: str) -> Found | None:
        from orchestrator.store import attempts

        found: list[Found] = []
        # A PostgreSQL restart while units start is ridden out as the writer rides it out
        # (same backoff and budget); past the budget the unit fails and the run stops.
        stored = self.store.read(lambda conn: attempts.load_checkpoint(conn, trial_id), budget_s=None)
        if stored is not None:
            found.append(Found(stored.state, stored.step, DATABASE, stored.trace))
        for folder in self.folders:
            path = trial_path(folder, self.sweep, key)
            if path.exists():
                data = path.read_bytes()
                try:
                    step = int(deserialize(data)["step"])
                except Exception:  # unreadable: the unit fails on it, as a configuration error
                    step = -1
                found.append(Found(data, step, FILE))
                break
        if not found:
            return None
        best = max(found, key=lambda f: f.step)
        if best.origin == FILE and best.step >= 0:
            # A file is written after the rows it covers are stored; its trace is those rows.
            rows = self.store.read(lambda conn: attempts.trace_upto(conn, trial_id, best.step), budget_s=None)
            best = Found(best.state, best.step, FILE, tuple(rows))
        return best


def start_loader(url: str, sweep: str, folders: list[Path]) -> tuple[str, Any]:
    """Start the run's :class:`Loader` beside the driver; returns the name units ask for and
    its handle (the actor lives while the caller holds the handle)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = f"orchestrator-checkpoints-{uuid.uuid4().hex[:12]}"
    here = ray.get_runtime_context().get_node_id()
    handle = (
        ray.remote(num_cpus=0)(Loader)
        # Restarted (elsewhere: the affinity is soft) if its node dies under the run.
        .options(
            name=name,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True),
            max_restarts=-1,
            max_task_retries=3,
            # a unit's stop poll is answered while another unit's checkpoint load waits on
            # the database
            max_concurrency=16,
        )
        .remote(url, sweep, [str(f) for f in folders])
    )
    return name, handle


def request_stop(handle: Any) -> None:
    """Tell the run's units to checkpoint where they are and end (fire and forget)."""
    try:
        handle.request_stop.remote()
    except Exception:  # already gone with its Ray: the units are gone too
        pass


class StopPoll:
    """In a unit: whether the driver asked its units to stop, asked of the run's loader at
    most every ``every`` seconds, so an eval loop may call it at every eval point. Each ask
    waits for the loader's answer (a few milliseconds, more on a loaded machine), except in
    a chain (``wait=False``): there the question goes out and its answer is read at a later
    call once it has come, so a chain of short trials never waits on it (its evals come
    often, so the stop is seen an eval later at most)."""

    def __init__(self, loader: str | None, every: float = 0.25, *, wait: bool = True) -> None:
        self.loader, self.every, self.wait = loader, every, wait
        self._next = 0.0
        self._actor: Any = None
        self._pending: Any = None  # an ask whose answer has not been read (wait=False)
        self.asked = False

    def __call__(self) -> bool:
        import time

        if self.asked:
            return True
        if self.loader is None:
            return False
        import ray

        try:
            if self._pending is not None:
                ready, _ = ray.wait([self._pending], timeout=0)
                if not ready:
                    return False
                answer, self._pending = self._pending, None
                self.asked = bool(ray.get(answer))
                if self.asked:
                    return True
            if time.monotonic() < self._next:
                return False
            self._next = time.monotonic() + self.every
            if self._actor is None:
                self._actor = ray.get_actor(self.loader)
            ref = self._actor.stopping.remote()
            if self.wait:
                self.asked = bool(ray.get(ref, timeout=10))
            else:
                self._pending = ref
        except Exception:  # the loader is restarting, or gone with the driver: go on
            self._actor = self._pending = None
        return self.asked


def stop_loader(handle: Any) -> None:
    import ray

    try:
        ray.kill(handle)
    except Exception:  # already gone with its Ray
        pass


# The run's loader by name, in this worker: a unit of a chain asks it once per member, and a
# name lookup is a round trip to Ray's control store each time.
_actors: dict[str, Any] = {}


def _ask(loader: str, method: str, *args: Any) -> Any:
    """``loader.method(*args)`` from a Ray worker, riding out the loader's restart (its node
    died: Ray starts it again elsewhere)."""
    import time

    import ray
    from ray.exceptions import ActorUnavailableError, RayActorError

    for wait in (1, 2, 4, 8, 0):
        try:
            actor = _actors.get(loader)
            if actor is None:
                actor = _actors[loader] = ray.get_actor(loader)
            return ray.get(getattr(actor, method).remote(*args))
        except (ActorUnavailableError, RayActorError, ValueError):
            _actors.pop(loader, None)
            if not wait:
                raise
            time.sleep(wait)
    return None


def fetch(loader: str | None, trial_id: int, key: str) -> Found | None:
    """A unit's member's checkpoint (in a Ray worker), or None (start from nothing)."""
    if loader is None:
        return None
    return _ask(loader, "load", trial_id, key)


def fetch_chain(loader: str | None, owner: str | None, members: list[tuple[int, str]]) -> dict[int, Found | None]:
    """A chain's members its driver still holds, each with its checkpoint (in a Ray worker;
    without a loader: every member, from nothing)."""
    if loader is None or owner is None:
        return dict.fromkeys(t for t, _ in members)
    return dict(_ask(loader, "chain", owner, members))
