"""Sweep specs (``sweeps/*.yaml``): validation and expansion into trials.

A spec crosses axes (any trial parameter, seeds included, ranges like ``seed: 0..9``) over
fixed parameters; ``zip`` ties axes that move together, ``exclude`` drops combinations, and
``blocks`` unions several such designs (for tables that are not one full product). Every
trial gets a stable key (hash of its resolved config). A bad spec raises ``SpecError`` with
one line naming the file, the key path and what was expected, before any trial starts and
before anything is written to a database.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.spec.expansion import (
    DEFAULT_MAX_TRIALS,
    check_design_size,
    check_sequential,
    check_stop,
    expand_trials,
    resolve_analysis,
    split_designs,
)
from orchestrator.spec.loading import import_plugins, parse_yaml, read_source, redact, stored_text, validate_shape
from orchestrator.spec.resources import (
    BYTES_PER_PARAM,
    CUDA_CONTEXT_BYTES,
    gpu_memory_bytes,
    model_params,
    node_memory_bytes,
    train_memory_bytes,
)
from orchestrator.spec.schema import Block, Budget, Resources, SpecError, StopSpec, Sweep, SweepSpec, failer

__all__ = [
    "BYTES_PER_PARAM",
    "CUDA_CONTEXT_BYTES",
    "DEFAULT_MAX_TRIALS",
    "Block",
    "Budget",
    "Resources",
    "SpecError",
    "StopSpec",
    "Sweep",
    "SweepSpec",
    "gpu_memory_bytes",
    "load",
    "model_params",
    "redact",
    "train_memory_bytes",
]


def load(
    path: str | Path | None = None,
    *,
    text: str | None = None,
    max_trials: int = DEFAULT_MAX_TRIALS,
    node_memory: int | None = None,
) -> Sweep:
    """Read, validate and expand a spec. Raises SpecError (a one-line UserError).

    ``max_trials`` caps the design (counted from the axis sizes before anything is
    expanded); ``node_memory`` (bytes, default this machine's) bounds a trial's model."""
    label = str(path) if path is not None else "<spec>"
    fail = failer(label)
    text = read_source(path, text, label)
    raw = parse_yaml(text, label)
    spec = validate_shape(raw, label, fail)
    import_plugins(spec, label)
    designs = split_designs(spec, raw, fail, max_trials)
    check_design_size(spec, designs, fail, max_trials)
    memory = node_memory if node_memory is not None else node_memory_bytes()
    expanded = expand_trials(spec, designs, fail, memory)
    sequential = check_sequential(spec, expanded.axes, label)
    analysis = resolve_analysis(spec, label)
    check_stop(spec, analysis, fail)
    stored = stored_text(text, expanded.warnings)
    path = Path(path) if path is not None else None
    # the expansion's trials, axes, matched models and warnings are the Sweep's fields of those names
    return Sweep(spec=spec, path=path, text=stored, sequential=sequential, analysis=analysis, **vars(expanded))
