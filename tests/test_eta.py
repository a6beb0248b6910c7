"""The ETA from the recent rate (orchestrator.eta): on a synthetic sweep (a minute of Ray
start-up, then four trials reporting every 100 steps, read every 2 s as `status --watch`
reads them) it is absent until the rate means something, then lands near the true end and
falls with the clock instead of climbing as the mean rate since the start did."""

from __future__ import annotations

import math

import pytest

from orchestrator.eta import RateWindow

STARTUP_S = 60.0  # Ray's start-up: no step done
TRIALS, STEPS, EVAL_EVERY, RATE = 4, 3000, 100, 5.0  # steps/s per trial
TOTAL = TRIALS * STEPS
END = STARTUP_S + STEPS / RATE  # the trials run side by side


def done_at(t: float) -> int:
    """Steps the database shows at time t: each trial's last eval, trials out of phase."""
    done = 0
    for i in range(TRIALS):
        ran = max(0.0, t - STARTUP_S - 7.0 * i / TRIALS) * RATE
        done += min(STEPS, int(ran // EVAL_EVERY) * EVAL_EVERY)
    return done


def polls(every: float = 2.0):
    t = 0.0
    while t < END:
        yield t, done_at(t)
        t += every


def mean_rate_eta(done: float, total: float, elapsed: float) -> float | None:
    # What the bar showed before: steps left at the mean rate since the start.
    return None if done <= 0 else (total - done) * elapsed / done


def test_eta_is_absent_until_meaningful_then_near_the_end_and_falling():
    w = RateWindow()
    seen: list[tuple[float, float | None]] = []
    for t, done in polls():
        w.add(t, done)
        seen.append((t, w.eta(TOTAL, t)))
    first = next(t for t, eta in seen if eta is not None)
    # Nothing during start-up, nor from the first evals (the first is at 80 s).
    assert first >= STARTUP_S + 20 + w.min_span_s
    # A minute of steady progress in: within 10% of the time left (the staircase of evals
    # every 20 s, read in a 60 s window, moves the fit by a few seconds either way).
    shown = [(t, eta) for t, eta in seen if STARTUP_S + 60 <= t <= END - 30]
    for t, eta in shown:
        assert eta is not None
        assert abs(t + eta - END) <= 0.1 * (END - t) + 15.0, (t, eta)
    # Read every 2 s, it never climbs by more than 20 s between reads (the mean rate climbed
    # by minutes) and falls by at most half a minute.
    for (t0, e0), (t1, e1) in zip(shown, shown[1:]):
        assert -30.0 <= e1 - e0 <= 20.0, (t0, e0, e1)
    # The same reads through the mean rate since the start: hours off at first (what the issue saw).
    t, done = next((t, d) for t, d in polls() if d > 0)
    assert mean_rate_eta(done, TOTAL, t) > 5 * (END - t)


def test_a_stall_has_no_rate_and_going_back_starts_over():
    w = RateWindow(window_s=60, min_span_s=10, min_changes=3)
    for t in range(0, 40, 2):
        w.add(float(t), t * 10.0)
    assert w.rate() == pytest.approx(10.0)
    assert w.eta(1000, 38.0) == pytest.approx((1000 - 380) / 10.0)
    assert w.eta(1000, 40.0) == pytest.approx((1000 - 400) / 10.0)  # the line, between readings
    # Nothing moves for longer than the window: no ETA rather than a made-up one.
    assert w.eta(1000, 38.0 + 61) is None
    # Progress went back (a trial retried from an earlier checkpoint): the old rate is dropped.
    w.add(100.0, 200.0)
    assert w.rate() is None and w.eta(1000, 100.0) is None


def test_old_samples_leave_the_window():
    w = RateWindow(window_s=60, min_span_s=10, min_changes=3)
    for t in range(0, 122, 2):  # 1 step/s for a minute, then 10 steps/s for a minute
        w.add(float(t), float(t if t < 60 else 60 + 10 * (t - 60)))
    # The rate is the last minute's (t = 60..120: 10 steps/s), not the mean since the start.
    assert w.rate() == pytest.approx(10.0)
    assert not math.isclose(w.rate() or 0, 660 / 120, rel_tol=0.2)
    with pytest.raises(ValueError):
        RateWindow(min_changes=0)
    with pytest.raises(ValueError):
        RateWindow(window_s=10, min_span_s=30)
