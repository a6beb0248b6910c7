"""Group-sequential boundaries: Lan–DeMets alpha spending, by recursive numerical integration.

The method is Armitage, McPherson & Rowe (1969) as laid out in Jennison & Turnbull,
*Group Sequential Methods* (2000), ch. 19: the score statistic S_k = Z_k·sqrt(t_k) is a
Brownian motion in the information fraction t, so the sub-density of S_k on the continuation
region at look k is the previous sub-density convolved with a normal increment. Each look's
boundary is found by root-finding so that the probability of first crossing at that look
equals the spending function's increment alpha(t_k) - alpha(t_{k-1}) (Lan & DeMets 1983).

Why not a PyPI package: ``gsdesign`` 0.1.5 (Nan Xiao, 2026, "Development Status :: 3 - Alpha")
ships only the integration primitives (``gridpts``, ``h1``, ``hupdate``) — no spending
functions or boundary solver; ``gsmethods`` 0.0.2 (2024) is a two-release early package. So the
boundaries are computed here and tested against the published tables (tests/test_design_boundaries.py).

Conventions (those of gsDesign and ldbounds): a two-sided design at level alpha is symmetric,
each side spending alpha/2 with the one-sided spending function evaluated at alpha/2. Both
boundaries stop the trial (no futility-only lower boundary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal
from collections.abc import Sequence

import numpy as np
from scipy import optimize, special, stats

Spending = Literal["obrien_fleming", "pocock"]
SPENDING_FUNCTIONS: tuple[str, ...] = ("obrien_fleming", "pocock")

# Grid points on the continuation region per look; Simpson's rule on this many points of a smooth
# normal mixture is accurate to ~1e-9 in crossing probability, far below what matters here.
_GRID = 801
# One-sided designs have no lower boundary; the density is negligible this many sd below the drift.
_TAIL_SD = 9.0


def spend(t: float | np.ndarray, alpha: float, spending: str) -> np.ndarray:
    """Cumulative one-sided alpha spent by information fraction ``t`` (Lan & DeMets 1983).

    ``obrien_fleming``: 2 - 2·Phi(z_{1-alpha/2} / sqrt(t)); ``pocock``: alpha·ln(1 + (e-1)·t).
    """
    t = np.clip(np.asarray(t, dtype=float), 0.0, 1.0)
    if spending == "obrien_fleming":
        with np.errstate(divide="ignore"):
            z = stats.norm.isf(alpha / 2) / np.sqrt(t)
        return np.where(t > 0, 2.0 * stats.norm.sf(z), 0.0)
    if spending == "pocock":
        return alpha * np.log1p((math.e - 1.0) * t)
    raise ValueError(f"unknown spending function {spending!r} (one of {', '.join(SPENDING_FUNCTIONS)})")


def _simpson_weights(n: int, width: float) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2] = 4.0
    w[2:-1:2] = 2.0
    return w * width / (3.0 * (n - 1))


@dataclass
class _Region:
    """Sub-density of the score statistic S on the continuation region at one look."""

    grid: np.ndarray  # S values
    dens: np.ndarray  # density x Simpson weight (so a sum is an integral)
    t: float


def _first_region(t: float, lo: float, hi: float, drift: float) -> _Region:
    grid = np.linspace(lo, hi, _GRID)
    dens = stats.norm.pdf(grid, loc=drift * t, scale=math.sqrt(t))
    return _Region(grid, dens * _simpson_weights(_GRID, hi - lo), t)


def _cross_prob(prev: _Region | None, t: float, lo: float, hi: float, drift: float) -> tuple[float, float]:
    """P(S_t > hi, not stopped before) and P(S_t < lo, not stopped before)."""
    if prev is None:
        sd, mu = math.sqrt(t), drift * t
        return float(stats.norm.sf((hi - mu) / sd)), float(stats.norm.cdf((lo - mu) / sd))
    dt = t - prev.t
    sd = math.sqrt(dt)
    mean = prev.grid + drift * dt
    up = float(np.dot(prev.dens, special.ndtr((mean - hi) / sd)))
    down = float(np.dot(prev.dens, special.ndtr((lo - mean) / sd)))
    return up, down


def _next_region(prev: _Region | None, t: float, lo: float, hi: float, drift: float) -> _Region:
    if prev is None:
        return _first_region(t, lo, hi, drift)
    dt = t - prev.t
    grid = np.linspace(lo, hi, _GRID)
    u = (grid[:, None] - prev.grid[None, :] - drift * dt) / math.sqrt(dt)
    kern = np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi * dt)
    dens = kern @ prev.dens
    return _Region(grid, dens * _simpson_weights(_GRID, hi - lo), t)


def _limits(z: float, t: float, sided: int, drift: float) -> tuple[float, float]:
    hi = z * math.sqrt(t)
    if sided == 2:
        return -hi, hi
    return min(drift * t - _TAIL_SD * math.sqrt(t), hi - 1e-9), hi


def _check_fractions(fractions: Sequence[float] | np.ndarray) -> np.ndarray:
    t = np.asarray(fractions, dtype=float)
    if t.ndim != 1 or t.size == 0:
        raise ValueError("information fractions must be a non-empty list")
    if np.any(np.diff(t) <= 0) or t[0] <= 0 or t[-1] > 1 + 1e-12:
        raise ValueError(f"information fractions must be strictly increasing in (0, 1], got {list(t)}")
    return t


@dataclass
class Boundaries:
    """A group-sequential design's efficacy boundaries on the z scale, one per look."""

    fractions: list[float]
    z: list[float]  # reject at look k when |Z_k| >= z[k] (two-sided) or Z_k >= z[k] (one-sided)
    alpha: float  # total type-I error (two-sided: both sides together)
    sided: int
    spending: str
    cumulative_alpha: list[float] = field(default_factory=list)  # total alpha spent by look k
    nominal_alpha: list[float] = field(default_factory=list)  # per-look p threshold for a fixed test

    def as_dict(self) -> dict:
        return {
            "fractions": self.fractions,
            "z": self.z,
            "alpha": self.alpha,
            "sided": self.sided,
            "spending": self.spending,
            "cumulative_alpha": self.cumulative_alpha,
            "nominal_alpha": self.nominal_alpha,
        }


def spending_boundaries(
    fractions: Sequence[float], alpha: float = 0.05, *, spending: str = "obrien_fleming", sided: int = 2
) -> Boundaries:
    """Lan–DeMets boundaries for the given information fractions (the last is normally 1).

    ``alpha`` is the total type-I error; a two-sided design spends alpha/2 per side.
    """
    if sided not in (1, 2):
        raise ValueError("sided must be 1 or 2")
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    t = _check_fractions(fractions)
    side_alpha = alpha / sided
    cum = spend(t, side_alpha, spending)
    inc = np.diff(np.concatenate([[0.0], cum]))
    zs: list[float] = []
    prev: _Region | None = None
    for k, tk in enumerate(t):
        target = float(inc[k])

        # Bound now: brentq calls it within this iteration only.
        def excess(z: float, tk: float = tk, prev: _Region | None = prev, target: float = target) -> float:
            lo, hi = _limits(z, tk, sided, 0.0)
            up, _ = _cross_prob(prev, tk, lo, hi, 0.0)
            return up - target

        # The per-side crossing probability falls monotonically in z; bracket generously.
        zk = float(optimize.brentq(excess, 0.0, 40.0, xtol=1e-10)) if target > 0 else math.inf
        zs.append(zk)
        lo, hi = _limits(min(zk, 40.0), tk, sided, 0.0)
        prev = _next_region(prev, tk, lo, hi, 0.0)
    nominal = [float(sided * stats.norm.sf(z)) for z in zs]
    return Boundaries(list(map(float, t)), zs, alpha, sided, spending, [float(sided * c) for c in cum], nominal)


def crossing_probabilities(
    z: Sequence[float] | np.ndarray, fractions: Sequence[float] | np.ndarray, *, sided: int = 2, drift: float = 0.0
) -> np.ndarray:
    """Probability of stopping first at each look, for boundaries ``z`` and a drift.

    ``drift`` is the mean of Z at t = 1 (under H0, 0). Two-sided: both sides count as stopping;
    the returned probabilities sum both sides.
    """
    t = _check_fractions(fractions)
    out = np.zeros(len(t))
    prev: _Region | None = None
    for k, tk in enumerate(t):
        zk = min(float(z[k]), 40.0)
        lo, hi = _limits(zk, tk, sided, drift)
        up, down = _cross_prob(prev, tk, lo, hi, drift)
        out[k] = up + (down if sided == 2 else 0.0)
        prev = _next_region(prev, tk, lo, hi, drift)
    return out


def _constant_family(k: int, alpha: float, sided: int, shape) -> list[float]:
    t = np.arange(1, k + 1) / k

    def excess(c: float) -> float:
        return float(crossing_probabilities(shape(c, t), t, sided=sided).sum()) - alpha

    c = float(optimize.brentq(excess, 0.5, 10.0, xtol=1e-10))
    return [float(v) for v in shape(c, t)]


def pocock_constants(k: int, alpha: float = 0.05, *, sided: int = 2) -> list[float]:
    """Pocock's (1977) constant boundary for ``k`` equally spaced looks (the classical, not spending, design)."""
    return _constant_family(k, alpha, sided, lambda c, t: np.full_like(t, c))


def obrien_fleming_constants(k: int, alpha: float = 0.05, *, sided: int = 2) -> list[float]:
    """O'Brien & Fleming's (1979) boundary c·sqrt(K/k) for ``k`` equally spaced looks."""
    return _constant_family(k, alpha, sided, lambda c, t: c / np.sqrt(t))
