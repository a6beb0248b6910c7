"""Per-trial checkpoint files, named by the trial's stable key.

Written atomically (temp file + rename) so a SIGKILL mid-write leaves the previous
checkpoint intact. On a multi-machine cluster the directory must be shared storage (NFS):
a trial may resume on another node.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from orchestrator.errors import UserError
from orchestrator.store.engine import sqlite_path


def default_root(db_url: str) -> Path:
    """Beside a SQLite file (``runs/orchestrator.db`` -> ``runs/checkpoints``); for
    PostgreSQL, ``runs/checkpoints/<hash of the URL>`` under the working directory, so two
    databases never share a sweep's checkpoints."""
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


def save(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
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
    return torch.load(path, map_location="cpu", weights_only=False)
