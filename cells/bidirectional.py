"""Bidirectional wrapper for any recurrent mixer (the masked-denoiser construction).

A forward stream runs the mixer on the sequence; a backward stream, a second instance of the
same mixer with its own parameters, runs the same recurrence on the time-flipped sequence.
The two are merged per position by summation::

    y[:, t] = fwd(x)[:, t] + flip(bwd(flip(x)))[:, t]

so position t sees x[:, :t+1] through the forward stream and x[:, t:] through the backward
one. The backward stream's short convolution, being causal on the flipped sequence, looks
ahead in the original order: the "short convolution in the backward stream" the seed paper
says bidirectional recall needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn as nn

from cells.harness import Mixer


class Bidirectional(nn.Module):
    """Sum of a forward and a time-reversed backward instance of ``make_mixer()``."""

    causal = False

    def __init__(self, make_mixer: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.fwd = make_mixer()
        self.bwd = make_mixer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fwd(x) + self.bwd(x.flip(1)).flip(1)

    def state_elements(self) -> int:
        """Both streams hold a state."""
        return cast(Mixer, self.fwd).state_elements() + cast(Mixer, self.bwd).state_elements()
