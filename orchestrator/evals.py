"""The eval point: one row of a trial's trace, and the one place its fields are named.

The training loop yields :class:`EvalPoint`; the runner's wire form, the store's ``evals``
table (``store/models.Eval`` builds its columns from :data:`NUMBERS`), its upsert and the
checkpoint trace read back, the reader's frame, the dashboard's traces and its CSV, the
export and the JSONL import (``store/import_jsonl.TracePoint``, from :data:`INPUT_NAMES` and
the fields' :data:`IMPORT_FINITE`/:data:`DIVERGES` marks) all take their column lists from
here. A new per-eval number is:

- a field here, between ``elapsed_s`` and ``metrics``, defaulting to None (producers that do
  not know it, old checkpoints and imported traces without it leave it NULL), with its
  producer: :func:`measured` when it is a function of the trial's parameters at the eval
  point (the lone trial and every seed-pack member are measured alike), else the training
  loop (``train/loop.Trainer.eval_point``) fills it;
- a migration that adds the column to ``evals`` and recreates the ``trial_trace`` view with
  it (the views live in the migrations only, each with its own frozen SQL).

``tests/test_store.py`` fails while the model (hence this file) and the migrations disagree;
``tests/test_eval_column_branch.py`` adds a number that way and follows it to ``sql``, the
dashboard and the export.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Marks in a number's field metadata (what each says is where it is read).
INPUT = "input"  # the JSONL import's key for it, when not the field's name
IMPORT_FINITE = "finite"  # an imported value must be finite (a setting or a clock, not a score)
DIVERGES = "diverges"  # a non-finite value (as a loss) marks an imported run diverged
MEASURE = "measure"  # the training loop's producer: parameters -> the value (:func:`measured`)

# What a measure is given: the trial's parameter tensors at the eval point (a seed-pack
# member's own slices), in ``model.parameters()`` order, under ``torch.no_grad``.
Measure = Callable[[Sequence[Any]], float]


def measured(fn: Measure) -> Any:
    """The field of a number the training loop measures at each eval point from the trial's
    parameters: ``param_norm: float | None = measured(lambda ps: ...)``."""
    return field(default=None, metadata={MEASURE: fn})


@dataclass
class EvalPoint:
    """One row of a trial's trace; each number is a column of ``evals`` (and of the
    ``trial_trace`` view) of its own, NULL where it was not recorded or was not finite (the
    store names the non-finite ones in ``evals.nonfinite``).

    - ``step``: optimizer updates done (the first eval is at step 1).
    - ``acc``, ``loss``: accuracy and mean cross-entropy on the held-out set.
    - ``train_loss``: the mean training loss since the previous eval point.
    - ``step_lr``: the learning rate this step ran at (the schedule applied to the trial's
      ``lr``; ``trials.lr`` is the trial's base lr); the JSONL import, and checkpoints written
      before the field was renamed, call it ``lr``.
    - ``elapsed_s``: the trial's training and eval wall seconds so far.
    - ``metrics``: the task's named extras (one JSON column).

    Every field between ``step`` and ``metrics`` is a number (or None)."""

    step: int
    acc: float = field(metadata={DIVERGES: True})
    loss: float = field(metadata={DIVERGES: True})
    train_loss: float | None = field(metadata={DIVERGES: True})
    step_lr: float = field(metadata={INPUT: "lr", IMPORT_FINITE: True})
    elapsed_s: float = field(metadata={IMPORT_FINITE: True})
    # New numbers here, each defaulting to None.
    metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalPoint:
        """A point of a checkpoint's trace; checkpoints written before the field was renamed
        call ``step_lr`` ``lr``, and those written before a number was added lack it."""
        d = dict(d)
        if "lr" in d and "step_lr" not in d:
            d["step_lr"] = d.pop("lr")
        return cls(**d)


# Every field, in order (the wire form's order after the trial id).
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EvalPoint))
# A number added after ``metrics`` would shift the wire form's positions and the numbers'.
assert FIELDS[0] == "step" and FIELDS[-1] == "metrics", FIELDS
# The number columns: every field between ``step`` and ``metrics``, in declaration order (the
# order of the table's columns, and the one the store's ``nonfinite`` marks name them in).
NUMBERS: tuple[str, ...] = FIELDS[1:-1]
# The ``evals`` table's columns besides its key (trial_id, step): the point's values, then
# the names of the values that were not finite (stored as NULL).
STORED: tuple[str, ...] = (*NUMBERS, "metrics", "nonfinite")
# A trace as the reader and the dashboard give it: key, then the numbers.
TRACE: tuple[str, ...] = ("trial_id", "step", *NUMBERS)

_META: dict[str, Mapping[str, Any]] = {f.name: f.metadata for f in fields(EvalPoint)}
# The JSONL import's key for each number (``lr`` for ``step_lr``).
INPUT_NAMES: dict[str, str] = {n: _META[n].get(INPUT, n) for n in NUMBERS}
# Numbers an import refuses unless finite; numbers whose non-finite value makes a run diverged.
FINITE_ON_IMPORT: tuple[str, ...] = tuple(n for n in NUMBERS if _META[n].get(IMPORT_FINITE))
DIVERGING: tuple[str, ...] = tuple(n for n in NUMBERS if _META[n].get(DIVERGES))
# The numbers the training loop measures from the parameters, and how.
MEASURES: dict[str, Measure] = {n: _META[n][MEASURE] for n in NUMBERS if MEASURE in _META[n]}


def measure(params: Sequence[Any]) -> dict[str, float]:
    """Every :func:`measured` number of the trial whose parameters are ``params``."""
    return {n: float(fn(params)) for n, fn in MEASURES.items()}
