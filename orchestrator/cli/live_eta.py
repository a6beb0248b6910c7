"""The terminal view's ETA from the recent rate (:class:`orchestrator.eta.RateWindow`):
``submit``/``resume`` and ``status --watch`` draw :mod:`orchestrator.ui.live`'s board with
this ETA instead of the mean rate since the start."""

from __future__ import annotations

import dataclasses
import time

from orchestrator.eta import RateWindow
from orchestrator.ui.live import TrialBoard


@dataclasses.dataclass
class RateBoard(TrialBoard):
    """A :class:`~orchestrator.ui.live.TrialBoard` whose ETA is its ``window``'s: each redraw
    adds the steps done now to the window, so the window sees every value the view shows."""

    window: RateWindow = dataclasses.field(default_factory=RateWindow)

    def eta(self) -> float | None:
        now = time.monotonic()
        self.window.add(now, self.done_steps)
        return self.window.eta(self.total_steps, now)

    @classmethod
    def of(cls, board: TrialBoard, window: RateWindow) -> RateBoard:
        """``board`` (read afresh from the database) with the window kept across redraws."""
        fields = {f.name: getattr(board, f.name) for f in dataclasses.fields(TrialBoard)}
        return cls(**fields, window=window)
