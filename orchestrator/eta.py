"""The ETA of a running sweep, from the rate of its recent progress.

The mean rate since the start counts Ray's start-up and the first trials' compilation as if
they were training, so early on it puts the end hours away and then pulls it in; and
progress read from the database moves only at eval points, so between two of them a mean
rate falls and the ETA climbs. :class:`RateWindow` instead fits steps against time over the
last ``window_s`` seconds (60) of readings, from the first time progress moved, and gives no
ETA until the fit rests on ``min_changes`` moves at least ``min_span_s`` apart.
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 60.0
MIN_SPAN_S = 30.0
MIN_CHANGES = 3
# Readings closer than this are one reading (the runner's events come in bursts).
RESOLUTION_S = 0.25


class RateWindow:
    """Progress readings ``(time, done)`` in, ``rate()`` and ``eta(total, now)`` out.

    The rate is the least-squares slope of done steps over time in the window: progress
    read at eval points is a staircase, and a line through all of it moves smoothly where
    a line through its two ends would jump at every step."""

    def __init__(self, window_s: float = WINDOW_S, min_span_s: float = MIN_SPAN_S, min_changes: int = MIN_CHANGES):
        if window_s <= 0 or not 0 <= min_span_s <= window_s or min_changes < 1:
            raise ValueError("window_s > 0, 0 <= min_span_s <= window_s and min_changes >= 1 expected")
        self.window_s = window_s
        self.min_span_s = min_span_s
        self.min_changes = min_changes
        self.samples: deque[tuple[float, float]] = deque()
        self._last: float | None = None

    def add(self, t: float, done: float) -> None:
        """Record that ``done`` steps were done at time ``t`` (seconds, any monotonic clock)."""
        last, self._last = self._last, done
        if last is not None and done < last:
            # Progress went back (a trial retried from its checkpoint): the old rate is moot.
            self.samples.clear()
            return
        if not self.samples and (last is None or done == last):
            # Before progress first moves (Ray's start-up; a reading taken mid-interval)
            # nothing says how fast it goes.
            return
        if self.samples and t - self.samples[-1][0] < RESOLUTION_S:
            self.samples[-1] = (self.samples[-1][0], done)
        else:
            self.samples.append((t, done))
        while self.samples and self.samples[0][0] < t - self.window_s:
            self.samples.popleft()

    def _changes(self) -> int:
        s = self.samples
        return sum(1 for (_, a), (_, b) in zip(s, list(s)[1:]) if b != a) + 1 if s else 0

    def _fit(self) -> tuple[float, float, float] | None:
        """(slope, mean time, mean done) of the window, or None while not meaningful."""
        s = self.samples
        if len(s) < 2 or s[-1][0] - s[0][0] < self.min_span_s or self._changes() < self.min_changes:
            return None
        n = len(s)
        mt = sum(t for t, _ in s) / n
        md = sum(d for _, d in s) / n
        sxx = sum((t - mt) ** 2 for t, _ in s)
        sxy = sum((t - mt) * (d - md) for t, d in s)
        if sxx <= 0 or sxy <= 0:
            return None
        return sxy / sxx, mt, md

    def rate(self) -> float | None:
        """Steps per second over the window; None while it is not yet meaningful (or when
        nothing moved for a whole window: a stall has no rate)."""
        fit = self._fit()
        return None if fit is None else fit[0]

    def eta(self, total: float, now: float) -> float | None:
        """Seconds until ``total`` steps at the window's rate, from where the fitted line is
        at ``now``; None when :meth:`rate` is."""
        if self.samples and now - self.samples[-1][0] > self.window_s:
            return None
        fit = self._fit()
        if fit is None:
            return None
        r, mt, md = fit
        return max(0.0, (total - (md + r * (now - mt))) / r)
