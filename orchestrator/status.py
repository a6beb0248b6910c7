"""Trial statuses: the one definition every layer uses (loop, runner, store, analysis, CLI).

Stored as the plain strings of the values (the ``trials.status`` column is a ``VARCHAR``);
``Status`` subclasses ``str`` so a member compares equal to, hashes like and is written as
its string. Member names equal their values, so nothing depends on whether a driver or
serializer writes an ``Enum`` by name or by value.
"""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    pending = "pending"
    running = "running"
    completed = "completed"
    failed = "failed"
    diverged = "diverged"
    # Never run by design: a group-sequential contrast was decided before this seed's look
    # (trials.error says "decided at look k"). Not an outcome, so the analysis leaves it out.
    skipped = "skipped"
    # Stopped by a cancel (Ctrl-C, SIGTERM, `orchestrator cancel`) or a lost database;
    # resume runs it again from its checkpoint.
    interrupted = "interrupted"
    # Kept for the record, no longer part of the sweep's design: never run, hidden from analysis.
    superseded = "superseded"

    # Keep ``f"{s}"`` and ``str(s)`` the bare value on every Python version.
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]


ALL: tuple[Status, ...] = tuple(Status)
# A resume leaves these alone: the trial ran to its end (diverged is an outcome, not a crash).
FINISHED: tuple[Status, ...] = (Status.completed, Status.diverged)
# A run that ended by itself: an outcome or an error (what a progress bar counts as finished).
ENDED: tuple[Status, ...] = (Status.completed, Status.diverged, Status.failed)
# Statuses that count as done for progress and ETA (a failed trial will not run again by itself).
DONE: tuple[Status, ...] = (Status.completed, Status.diverged, Status.failed, Status.skipped)
# A resume runs none of these again (superseded: no longer in the design; skipped: decided).
SETTLED: tuple[Status, ...] = FINISHED + (Status.skipped, Status.superseded)
# A ``running`` trial whose heartbeat is older than the lease TTL is *shown* as stale (its
# driver is gone); stale is derived when reading, never stored (store/progress.py).
STALE = "stale"
