"""What a cell family tells the registry: its cross-knob checks and its mixer factory.

Each family module (``cells/delta.py``, ``cells/mlstm.py``, ...) ends with a ``FAMILY``;
``cells/registry.py`` holds only the table of arms (name, family, knobs, default sizes).
A new family is therefore its module (mixer + ``FAMILY``) and its rows in the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch.nn as nn

Knobs = dict[str, Any]
MixerFactory = Callable[[], nn.Module]


def _no_check(arm: str, k: Knobs, d: int) -> None:
    return None


def _never(k: Knobs) -> bool:
    return False


def _no_max_len(k: Knobs) -> int | None:
    return None


@dataclass(frozen=True)
class Family:
    """A cell family: how to build one layer's mixer, and which knob values cannot be built.

    The mixer (what ``mixer(k, d)()`` returns) is an ``nn.Module`` with
    ``forward(x) -> y``, both ``(B, T, d)`` float; ``state_elements() -> int``, its
    recurrent state per layer (what ``orchestrator cells`` reports and the factorial
    matches); and ``causal: bool`` (True: position ``t`` sees only ``<= t``). See
    :mod:`cells.harness`, which wraps it (embedding, norms, MLP, readout) for every arm.
    ``examples/plugin/`` is a complete family written from this class alone.
    """

    #: The family's name: an :class:`cells.ArmSpec` names its family by it.
    name: str
    #: Required. ``mixer(k, d)``: a zero-argument factory of one layer's mixer for the arm's
    #: resolved knobs ``k`` (every knob, defaults filled in) at width ``d`` (d_model).
    mixer: Callable[[Knobs, int], MixerFactory]
    #: ``check(arm, k, d)`` raises a one-line ValueError for knob combinations that cannot be
    #: built (called before anything is built; start the message with :func:`where`).
    check: Callable[[str, Knobs, int], None] = _no_check
    #: The mixer handles ``bidirectional`` itself (else the registry wraps it in Bidirectional).
    own_bidirectional: bool = False
    #: ``blendable(k)``: the model exposes ``set_read_blend`` (the anneals need it).
    blendable: Callable[[Knobs], bool] = _never
    #: ``max_len(k)``: the longest sequence learned positions cover (None: no positional table).
    max_len: Callable[[Knobs], int | None] = _no_max_len
    #: "fixed": recurrent state per layer; "per_token": KV elements per token (attention).
    state_scaling: str = "fixed"


def where(arm: str, d: int) -> str:
    """The prefix of a check's error message."""
    return f"arm {arm!r} at d_model {d}"


def check_heads(arm: str, k: Knobs, d: int) -> None:
    """The check of families whose heads split d_model."""
    if d % k["heads"]:
        raise ValueError(f"{where(arm, d)}: d_model must be divisible by heads ({k['heads']})")


def knob_mixer(layer: Callable[..., nn.Module], *names: str) -> Callable[[Knobs, int], MixerFactory]:
    """The ``mixer`` of a family whose layer is ``layer(d, name=k[name], ...)`` for ``names``."""

    def mixer(k: Knobs, d: int) -> MixerFactory:
        return partial(layer, d, **{name: k[name] for name in names})

    return mixer
