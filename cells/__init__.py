"""The cell zoo: one registry, one harness, one module per cell family.

Public API (what the training loop, the sweep validator and the CLI use)::

    build(arm, vocab_size, d_model=None, n_layers=None, **knobs) -> nn.Module   # (B, T) -> (B, T, V)
    ARMS                                   # registered arm names
    knobs(arm) -> {knob: default}          # what an arm accepts
    validate(arm, knobs, d_model=None, n_layers=None)   # ValueError, builds nothing
    describe(arm, vocab_size, d_model=None, n_layers=None, **knobs) -> dict

See cells/README.md for the arms, their knobs and the parameter/state accounting.
"""
from cells.registry import ARMS, build, describe, knob_help, knobs, validate

__all__ = ["ARMS", "build", "describe", "knob_help", "knobs", "validate"]
