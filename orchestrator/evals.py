"""The eval point: one row of a trial's trace, and the one place its fields are named.

The training loop yields :class:`EvalPoint`; the runner's wire form, the store's ``evals``
upsert and checkpoint trace, the reader's frame, the dashboard's traces and its CSV all take
their column lists from here. A new per-eval number is a field here, a column in
``store/models.Eval`` and a migration (``tests/test_eval_schema.py`` checks that the three
agree, and the view ``eval_points`` with them); everything else follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class EvalPoint:
    """One row of a trial's trace. ``step`` counts optimizer updates done (the first eval is
    at step 1); ``train_loss`` is the mean training loss since the previous eval point;
    ``step_lr`` is the learning rate this step ran at (the schedule applied to the trial's
    ``lr``), the store's ``evals.step_lr``. Every field between ``step`` and ``metrics`` is a
    number (or None) stored in a column of its own; ``metrics`` holds the task's named extras
    (one JSON column)."""

    step: int
    acc: float
    loss: float
    train_loss: float | None
    step_lr: float
    elapsed_s: float
    metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalPoint:
        """A point of a checkpoint's trace; checkpoints written before the field was renamed
        call ``step_lr`` ``lr``."""
        d = dict(d)
        if "lr" in d and "step_lr" not in d:
            d["step_lr"] = d.pop("lr")
        return cls(**d)


# Every field, in order (the wire form's order after the trial id).
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EvalPoint))
# The number columns, in the order the store's ``nonfinite`` marks name them.
NUMBERS: tuple[str, ...] = tuple(n for n in FIELDS if n not in ("step", "metrics"))
# The ``evals`` table's columns besides its key (trial_id, step): the point's values, then
# the names of the values that were not finite (stored as NULL).
STORED: tuple[str, ...] = (*NUMBERS, "metrics", "nonfinite")
# A trace as the reader and the dashboard give it: key, then the numbers.
TRACE: tuple[str, ...] = ("trial_id", "step", *NUMBERS)
