"""A plugin cell for `orchestrator bench overhead`: ``bench_sleep``, whose training steps take
a fixed wall time (``model.step_ms`` milliseconds each, slept in its forward pass against a
deadline), so a trial of N steps trains for a known time whatever the machine.

It is registered only where a spec names this module under ``plugins:`` (the bench's own
spec does); users never see it in ``orchestrator cells``. The trial around it is a real
one: the task's batches, a (tiny) model trained by the real loop, eval rows, checkpoints.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn

from cells import ArmSpec, Family, Knob, KnobSet, register_cell

NAME = "bench_sleep"


class SleepMixer(nn.Module):
    """A linear map whose n-th training forward returns no earlier than n * ``step_ms`` after
    the first began: the steps take a fixed wall time in all, whatever the model's own
    compute (evals do not sleep)."""

    causal = True

    def __init__(self, d: int, step_ms: float) -> None:
        super().__init__()
        self.lin, self.step_s, self.d = nn.Linear(d, d), step_ms / 1000.0, d
        self._t0: float | None = None
        self._steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.step_s > 0:
            now = time.monotonic()
            if self._t0 is None:
                self._t0 = now
            self._steps += 1
            time.sleep(max(0.0, self._t0 + self._steps * self.step_s - now))
        return self.lin(x)

    def state_elements(self) -> int:
        return self.d


FAMILY = Family(NAME, lambda k, d: lambda: SleepMixer(d, k["step_ms"]))
ARM = ArmSpec(
    NAME,
    NAME,
    "benchmark only: a linear mixer that sleeps step_ms per training step",
    KnobSet(
        {
            "step_ms": Knob(100.0, "float", "milliseconds slept per training step", minimum=0.0, maximum=60_000.0),
            "mlp": Knob(False, "bool", "pre-norm residual MLP"),
            "mlp_ratio": Knob(2, "int", "MLP width multiple", minimum=1),
            "norm": Knob(False, "bool", "RMSNorm"),
        }
    ),
    d_model=8,
    n_layers=1,
)
register_cell(ARM, FAMILY)
