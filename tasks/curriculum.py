"""Gap curricula: state machines that set the table-to-query gap cap per training batch.

The loop's protocol, once per optimizer step::

    state = cur.state()                       # {"cap": c}: the task draws gap ~ U{0..c}
    inputs, targets = task.train_batch(B, gen, state)
    ...optimizer step...
    cur.observe(step, probe_acc)              # accuracy on that batch's supervised positions
    trace.update(cur.metrics())               # {"curriculum_cap": c, ...}

Kinds (parameter ``curriculum`` of the gap tasks):

* ``uniform`` -- the cap is always the maximum gap (gap ~ U[0, max] per batch).
The machines count observations (``t``), so the loop may number its steps from 0 or 1; the
``step`` argument is only recorded.

* ``ramp`` -- time-based: after ``t`` observed steps the cap is
  ``start + floor((max - start) * min(1, t / ramp_steps))``, whether or not the model keeps up.
* ``gated`` -- success-gated: a running estimate ``est <- ema * est + (1 - ema) * acc``
  (starting at 0) is kept; every ``every`` observed steps, if ``est >= threshold`` the cap
  grows by ``step`` (up to the maximum). It never retreats.

State is plain Python (``state_dict`` / ``load_state_dict``) so it survives ``torch.save`` and
JSON inside a trial checkpoint.
"""

from __future__ import annotations

import math
from typing import Any


class Curriculum:
    """Base: a gap cap in ``[0, max_gap]`` (units: distractor pairs)."""

    kind: str = ""

    def __init__(self, max_gap: int) -> None:
        self.max_gap = int(max_gap)
        self.cap = self.max_gap
        self.steps_seen = 0
        self.last_step: int | None = None

    def state(self) -> dict[str, int]:
        """What ``train_batch`` takes as ``curriculum_state``."""
        return {"cap": int(self.cap)}

    def observe(self, step: int, probe_acc: float) -> None:
        """Record one optimizer step (the loop's number ``step``) and its training-batch accuracy."""
        self.steps_seen += 1
        self.last_step = int(step)

    def metrics(self) -> dict[str, float]:
        """Streamed into the trace after every step."""
        return {"curriculum_cap": float(self.cap)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "max_gap": self.max_gap,
            "cap": int(self.cap),
            "steps_seen": int(self.steps_seen),
            "last_step": self.last_step,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if d.get("kind") != self.kind or int(d.get("max_gap", -1)) != self.max_gap:
            raise ValueError(
                f"curriculum state is for {d.get('kind')!r} with max_gap "
                f"{d.get('max_gap')}, not {self.kind!r} with max_gap {self.max_gap}"
            )
        self.cap = int(d["cap"])
        self.steps_seen = int(d["steps_seen"])
        self.last_step = None if d.get("last_step") is None else int(d["last_step"])


class UniformGap(Curriculum):
    """Gap ~ U[0, max] for every batch."""

    kind = "uniform"


class RampGap(Curriculum):
    """Time-based ramp from ``start`` to ``max_gap`` over ``ramp_steps`` observed steps."""

    kind = "ramp"

    def __init__(self, max_gap: int, start: int, ramp_steps: int) -> None:
        super().__init__(max_gap)
        self.start = min(int(start), self.max_gap)
        self.ramp_steps = int(ramp_steps)
        self.cap = self._cap_at(0)

    def _cap_at(self, t: int) -> int:
        if self.ramp_steps <= 0:
            return self.max_gap
        frac = min(1.0, t / self.ramp_steps)
        return self.start + math.floor((self.max_gap - self.start) * frac)

    def observe(self, step: int, probe_acc: float) -> None:
        super().observe(step, probe_acc)
        self.cap = self._cap_at(self.steps_seen)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "start": self.start, "ramp_steps": self.ramp_steps}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self.start = int(d["start"])
        self.ramp_steps = int(d["ramp_steps"])


class GatedGap(Curriculum):
    """Success-gated ramp: advance by ``step`` every ``every`` steps while the running accuracy
    estimate is ``>= threshold``; never retreat."""

    kind = "gated"

    def __init__(
        self, max_gap: int, start: int, threshold: float = 0.6, every: int = 25, step: int = 1, ema: float = 0.9
    ) -> None:
        super().__init__(max_gap)
        self.cap = min(int(start), self.max_gap)
        self.threshold = float(threshold)
        self.every = int(every)
        self.step = int(step)
        self.ema = float(ema)
        self.estimate = 0.0
        self.advances = 0

    def observe(self, step: int, probe_acc: float) -> None:
        super().observe(step, probe_acc)
        self.estimate = self.ema * self.estimate + (1.0 - self.ema) * float(probe_acc)
        if self.steps_seen % self.every == 0 and self.estimate >= self.threshold and self.cap < self.max_gap:
            self.cap = min(self.max_gap, self.cap + self.step)
            self.advances += 1

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "curriculum_estimate": float(self.estimate)}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "threshold": self.threshold,
            "every": self.every,
            "step": self.step,
            "ema": self.ema,
            "estimate": float(self.estimate),
            "advances": int(self.advances),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self.threshold = float(d["threshold"])
        self.every = int(d["every"])
        self.step = int(d["step"])
        self.ema = float(d["ema"])
        self.estimate = float(d["estimate"])
        self.advances = int(d["advances"])
