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
    """``mixer(k, d)`` is a zero-argument factory of one layer's mixer for resolved knobs
    ``k`` at width ``d``; ``check(arm, k, d)`` raises a one-line ValueError for knob
    combinations that can not be built (called before anything is built)."""

    name: str
    mixer: Callable[[Knobs, int], MixerFactory]
    check: Callable[[str, Knobs, int], None] = _no_check
    # The mixer handles ``bidirectional`` itself (else the registry wraps it in Bidirectional).
    own_bidirectional: bool = False
    # Model exposes ``set_read_blend`` (the anneals need it).
    blendable: Callable[[Knobs], bool] = _never
    # Longest sequence learned positions cover (None: no positional table).
    max_len: Callable[[Knobs], int | None] = _no_max_len
    # "fixed": recurrent state per layer; "per_token": KV elements per token (attention).
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
