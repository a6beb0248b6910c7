"""The cell zoo: one registry, one harness, one module per cell family.

Public API (what the training loop, the sweep validator and the CLI use)::

    build(arm, vocab_size, d_model=None, n_layers=None, **knobs) -> nn.Module   # (B, T) -> (B, T, V)
    ARMS                                   # registered arm names
    knobs(arm) -> {knob: default}          # what an arm accepts
    validate(arm, knobs, d_model=None, n_layers=None)   # ValueError, builds nothing
    describe(arm, vocab_size, d_model=None, n_layers=None, **knobs) -> dict
    register_cell(ArmSpec(...), Family(...))   # a plugin's own arm (and family)

See cells/README.md for the arms, their knobs and the parameter/state accounting.
"""

from cells.family import Family
from cells.knobs import Knob, KnobSet
from cells.registry import ARMS, ArmSpec, build, describe, knob_help, knobs, register_cell, validate

__all__ = [
    "ARMS",
    "ArmSpec",
    "Family",
    "Knob",
    "KnobSet",
    "build",
    "describe",
    "knob_help",
    "knobs",
    "register_cell",
    "validate",
]
