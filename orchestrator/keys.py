"""Stable trial identity: a hash of what determines a trial's trajectory.

Ray Tune's own trial ids change on every launch; ours must not, so re-submitting a spec names
the same trials and adding seeds adds only the new ones.

The key covers what decides where a trial goes, not how far it runs or how it is executed:

- the budget, ``steps`` and ``eval_every``: a larger ``steps`` continues the same trial from
  its checkpoint (its trace so far stays as it is); evaluating more or less often never
  touches the training stream;
- execution-only settings, ``threads`` and ``checkpoint_every_s``;
- ``tag.*`` labels, which never reach the model or the data.

``steps`` stays in the key when the budget shapes the trajectory itself, so that extending
it would change the past (``budget_shapes_trajectory`` says why): a ``cosine`` schedule
without an explicit ``cosine_steps`` period, a read-blend ``anneal`` (its length is a fraction
of the budget), a ``ramp`` curriculum without ``ramp_steps`` (it spans half the budget).
Such a trial at another budget is another trial.

The key survives an upgrade of the tool. Resolved configs carry every top-level field with
its default filled in, so a release that adds a field would change every key (and strand
every checkpoint) if the key hashed them all. The identity schema is therefore versioned:
:data:`IDENTITY_V1` lists the top-level fields a key has always hashed (defaults included,
so stored keys stay as they are); a field added after it enters the key only when a trial
sets it to something other than its default, which is the only case where it makes another
trial. Add a new field to ``TrialParams`` and nothing here changes; ``tests/test_keys.py``
pins it.

Imported records (``record_key``) keep a hash of every parameter: they are finished runs from
elsewhere, never continued. Migration ``0005_identity`` re-keys databases written before this
rule with a frozen copy of it; change the rule only together with a new migration.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from orchestrator.params import TrialParams

# The top-level fields of identity schema 1, frozen: keys hash them whatever their value.
# Never edit this list; a field added to TrialParams after it is hashed only off its default.
IDENTITY_V1 = frozenset(
    (
        "arm", "task", "seed", "data_seed", "eval_seed", "lr", "batch_size", "steps", "eval_every",
        "schedule", "cosine_steps", "min_lr_ratio", "warmup_steps", "weight_decay", "beta1", "beta2",
        "grad_clip", "d_model", "n_layers", "device", "fp32", "rebinding", "anneal", "anneal_frac",
        "anneal_escape_at", "checkpoint_every_s", "threads",
    )
)  # fmt: skip
BUDGET_FIELDS = ("steps", "eval_every")
EXECUTION_FIELDS = ("threads", "checkpoint_every_s")
LABEL_PREFIX = "tag."


def canonical_json(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def budget_shapes_trajectory(params: Mapping[str, Any]) -> str | None:
    """Why this resolved config's trajectory depends on its ``steps``, or None."""
    if params.get("schedule") == "cosine" and params.get("cosine_steps") is None:
        return "its cosine schedule decays over the budget (set cosine_steps to fix the period)"
    if params.get("anneal", "none") != "none":
        return f"its {params['anneal']} anneal lasts a fraction (anneal_frac) of the budget"
    if params.get("task.curriculum") == "ramp" and params.get("task.ramp_steps") is None:
        return "its ramp curriculum spans half the budget (set task.ramp_steps to fix it)"
    return None


def non_identity(name: str, params: Mapping[str, Any]) -> bool:
    """True for a parameter that can change without making another trial."""
    if name.startswith(LABEL_PREFIX) or name in EXECUTION_FIELDS:
        return True
    if name in BUDGET_FIELDS:
        return name != "steps" or budget_shapes_trajectory(params) is None
    return False


def _at_default(name: str, value: Any) -> bool:
    """A top-level field newer than :data:`IDENTITY_V1` left at its default."""
    if name in IDENTITY_V1 or "." in name:
        return False
    field = TrialParams.model_fields.get(name)
    return field is not None and not field.is_required() and value == field.get_default(call_default_factory=True)


def identity(params: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved config that decides the trajectory (identity schema 1: see
    the module docstring)."""
    return {k: v for k, v in params.items() if not non_identity(k, params) and not _at_default(k, v)}


def trial_key(params: Mapping[str, Any]) -> str:
    """16 hex chars of sha256 over the canonical JSON of the trial's identity."""
    return hashlib.sha256(canonical_json(identity(params)).encode()).hexdigest()[:16]


def record_key(params: Mapping[str, Any]) -> str:
    """The key of an imported record (store/import_jsonl.py): a finished run from elsewhere,
    never continued, so every parameter (tags included) tells two records apart."""
    return hashlib.sha256(canonical_json(params).encode()).hexdigest()[:16]


def spec_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
