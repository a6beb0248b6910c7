"""A cell family with one arm, from the base classes: ``cells.Family`` (how to build a layer's
mixer, which knob values cannot be built) and ``cells.ArmSpec`` (the arm's name, family and
knobs). The mixer is a causal running mean: the tiniest recurrent cell (its state: one
d_model vector, the running sum)."""

from __future__ import annotations

import torch
import torch.nn as nn

from cells import ArmSpec, Family, Knob, KnobSet, register_cell
from cells.family import where
from cells.registry import HARNESS


class RunningMean(nn.Module):
    """``(B, T, d) -> (B, T, d)``: position t reads the mean of positions <= t, scaled."""

    causal = True  # position t sees only positions <= t

    def __init__(self, d: int, scale: float):
        super().__init__()
        self.inp, self.out, self.scale, self.d = nn.Linear(d, d), nn.Linear(d, d), scale, d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[None, :, None]
        return self.out(self.scale * torch.cumsum(self.inp(x), dim=1) / n)

    def state_elements(self) -> int:
        return self.d  # the running sum, per layer


def _check(arm: str, k: dict, d: int) -> None:
    # Called before anything is built: one line, starting with where() ("arm 'x' at d_model d").
    if k["scale"] > 4 and d < 16:
        raise ValueError(f"{where(arm, d)}: scale > 4 needs d_model >= 16")


FAMILY = Family("running_mean", mixer=lambda k, d: lambda: RunningMean(d, k["scale"]), check=_check)

ARM = ArmSpec(
    "running_mean",
    "running_mean",
    "causal running mean (example plugin)",
    # The arm's own knob (model.scale in a spec) and the harness's (mlp, mlp_ratio, norm,
    # mlp_hidden), which every arm takes.
    KnobSet({"scale": Knob(1.0, "float", "output scale", minimum=0.0, maximum=8.0), **HARNESS}),
    d_model=16,
)

register_cell(ARM, FAMILY)
