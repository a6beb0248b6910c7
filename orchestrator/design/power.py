"""Power before the run: seeds per group for Fisher (exact) and log-rank (simulation) contrasts.

Fisher: the fixed design's power is a full enumeration of the two binomials against the exact
test's rejection region; the group-sequential design's power and stopping distribution are
exact too — the not-yet-stopped probability mass over (x0, x1) is carried from look to look by
the binomial increments (the seeds added between looks are independent of the earlier ones).
Power of Fisher's test is a sawtooth in n (the attainable p-values jump), so both the smallest n
reaching the target and the smallest n beyond which it stays there (within the scanned range)
are reported.

Log-rank: escape times are exponential in training steps (hazard ln 2 / median), seen at the
first eval at or after the escape, censored at the budget (administrative censoring). Power is by
simulation with a seeded RNG (common random numbers across n, so the search in n is smooth), and
cross-checked against Schoenfeld's (1981) events formula.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from collections.abc import Sequence

import numpy as np
from scipy import stats

from orchestrator.design.boundaries import spending_boundaries
from orchestrator.design.stats import fisher_table, logrank_counts, z_from_p


def _binom(n: int, p: float) -> np.ndarray:
    return stats.binom.pmf(np.arange(n + 1), n, p)


@lru_cache(maxsize=1024)
def _fisher_z_table(n: int, sided: int) -> np.ndarray:
    """Signed z of Fisher's test for every (x0, x1) with n seeds per group (as ``decide_look`` computes it)."""
    alt = "two-sided" if sided == 2 else "greater"
    p = fisher_table(n, n, alt)
    x = np.arange(n + 1)
    diff = x[:, None] - x[None, :]
    z = z_from_p(p, diff, sided)
    z.flags.writeable = False  # shared through the cache
    return z


def fisher_power(p0: float, p1: float, n: int, alpha: float = 0.05, sided: int = 2) -> float:
    """Exact power of Fisher's test at level alpha with n seeds per group (full enumeration)."""
    alt = "two-sided" if sided == 2 else "greater"
    reject = fisher_table(n, n, alt) <= alpha * (1 + 1e-12)
    return float(_binom(n, p0) @ reject @ _binom(n, p1))


@dataclass
class FixedSize:
    n: int | None  # smallest n reaching the target power (None: not within n_max)
    power: float | None  # its power
    n_stays: int | None  # smallest n from which power stays >= target through n_scanned
    n_scanned: int
    curve: list[tuple[int, float]]  # (n, power) for every n scanned

    def as_dict(self) -> dict:
        return asdict(self)


def fisher_sample_size(
    p0: float, p1: float, alpha: float = 0.05, power: float = 0.8, sided: int = 2, n_max: int = 400
) -> FixedSize:
    """Seeds per group for a fixed-n Fisher test (exact), with the sawtooth made explicit."""
    curve: list[tuple[int, float]] = []
    first: int | None = None
    limit = n_max
    for n in range(2, n_max + 1):
        pw = fisher_power(p0, p1, n, alpha, sided)
        curve.append((n, pw))
        if first is None and pw >= power:
            first = n
            # Scan on so the sawtooth's last dip below target shows up (it shrinks with n).
            limit = min(n_max, 2 * n + 10)
        if n >= limit:
            break
    stays = None
    if first is not None:
        for n, pw in reversed(curve):
            if pw < power:
                break
            stays = n
    pw_first = dict(curve).get(first) if first is not None else None
    return FixedSize(first, pw_first, stays, curve[-1][0], curve)


@dataclass
class SequentialResult:
    looks: list[int]  # seeds per group at each look
    boundaries: list[float]
    power: float  # P(reject) under H1
    size: float  # P(reject) under H0 (exact for Fisher; <= alpha, conservative)
    stop_h1: list[float]  # P(stop at look k) under H1
    stop_h0: list[float]
    expected_n_h1: float  # expected seeds per group
    expected_n_h0: float
    method: str

    def as_dict(self) -> dict:
        return asdict(self)


def _fisher_sequential_pass(
    p0: float, p1: float, looks: Sequence[int], z: Sequence[float], sided: int
) -> tuple[float, np.ndarray]:
    """Exact P(reject) and P(stop at each look) of the Fisher sequential design."""
    stop = np.zeros(len(looks))
    reject = 0.0
    mass = np.outer(_binom(looks[0], p0), _binom(looks[0], p1))
    for k, n in enumerate(looks):
        zt = _fisher_z_table(n, sided)
        cross = np.abs(zt) >= z[k] if sided == 2 else zt >= z[k]
        r = float(mass[cross].sum())
        reject += r
        if k == len(looks) - 1:
            stop[k] = float(mass.sum())
            break
        stop[k] = r
        mass = np.where(cross, 0.0, mass)
        d = looks[k + 1] - n
        inc0, inc1 = _binom(d, p0), _binom(d, p1)
        # B[i, j] = P(j successes after | i before) for the d new seeds
        b0 = np.zeros((n + 1, looks[k + 1] + 1))
        b1 = np.zeros((n + 1, looks[k + 1] + 1))
        for i in range(n + 1):
            b0[i, i : i + d + 1] = inc0
            b1[i, i : i + d + 1] = inc1
        mass = b0.T @ mass @ b1
    return reject, stop


def fisher_sequential(
    p0: float, p1: float, looks: Sequence[int], alpha: float = 0.05, spending: str = "obrien_fleming", sided: int = 2
) -> SequentialResult:
    """Exact operating characteristics of the group-sequential Fisher design.

    H0 is taken at the pooled rate (p0 + p1) / 2 for the expected seeds and the exact size.
    """
    looks = list(looks)
    b = spending_boundaries([n / looks[-1] for n in looks], alpha, spending=spending, sided=sided)
    pw, s1 = _fisher_sequential_pass(p0, p1, looks, b.z, sided)
    pn = (p0 + p1) / 2
    size, s0 = _fisher_sequential_pass(pn, pn, looks, b.z, sided)
    ln = np.asarray(looks, dtype=float)
    return SequentialResult(
        looks, b.z, pw, size, s1.tolist(), s0.tolist(), float(s1 @ ln), float(s0 @ ln), "exact enumeration"
    )


def scaled_looks(looks: Sequence[int], n_max: int) -> list[int] | None:
    """The looks' schedule stretched to end at n_max (same fractions, rounded); None if looks collide."""
    f = np.asarray(looks, dtype=float) / looks[-1]
    out = [max(1, int(round(x * n_max))) for x in f]
    return out if all(b > a for a, b in zip(out, out[1:])) else None


def sequential_sample_size(evaluate, looks: Sequence[int], power: float, n_max: int, n_fixed: int | None = None):
    """Smallest schedule (the looks' fractions scaled to a last look N) whose power reaches target.

    With the fixed design's n known the search starts at 0.8·n_fixed: a group-sequential design's
    maximum n is never below the fixed one for continuous statistics (the inflation factor is
    >= 1), and 0.8 leaves room for the discrete tests' sawtooth.
    """
    start = len(looks) if n_fixed is None else max(len(looks), int(0.8 * n_fixed))
    for n in range(start, n_max + 1):
        sched = scaled_looks(looks, n)
        if sched is None:
            continue
        res = evaluate(sched)
        if res.power >= power:
            return res
    return None


# ---------------------------------------------------------------- log-rank


def hazard_from_median(median: float) -> float:
    """Per-step hazard of an exponential escape time with this median."""
    return math.log(2.0) / median


def escape_prob(hazard: float, budget: float) -> float:
    return 1.0 - math.exp(-hazard * budget)


def schoenfeld_n(
    h0: float, h1: float, budget: float, alpha: float = 0.05, power: float = 0.8, sided: int = 2
) -> tuple[float, float]:
    """Schoenfeld (1981): events D = (z_{1-a} + z_{power})^2 / (p(1-p) ln(HR)^2), p = 1/2; n per group."""
    za = stats.norm.isf(alpha / sided)
    zb = stats.norm.isf(1 - power)
    d = (za + zb) ** 2 / (0.25 * math.log(h0 / h1) ** 2)
    return float(d), float(d / (escape_prob(h0, budget) + escape_prob(h1, budget)))


@dataclass
class EscapeModel:
    """Two groups' exponential escape hazards (per step), eval spacing and budget (censoring)."""

    h0: float
    h1: float
    budget: int
    eval_every: int

    @property
    def n_evals(self) -> int:
        return self.budget // self.eval_every

    def draw(self, rng: np.random.Generator, sweeps: int, n: int, null: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Eval-bin index per (sweep, seed) per group; n_evals means censored at the budget."""
        h1 = self.h0 if null else self.h1
        out = []
        for h in (self.h0, h1):
            t = rng.exponential(1.0 / h, size=(sweeps, n))
            j = np.ceil(t / self.eval_every).astype(np.int64) - 1  # first eval at/after escape
            out.append(np.minimum(j, self.n_evals))
        return out[0], out[1]


def _counts(bins: np.ndarray, n_evals: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-sweep event and censoring counts per eval bin (censored ones sit at the last bin)."""
    s = bins.shape[0]
    width = n_evals + 1
    flat = np.bincount((np.arange(s)[:, None] * width + bins).ravel(), minlength=s * width)
    c = flat.reshape(s, width)
    d = c[:, :n_evals].copy()
    cens = np.zeros_like(d)
    cens[:, -1] = c[:, n_evals]
    return d, cens


def logrank_z_sims(b0: np.ndarray, b1: np.ndarray, n: int, n_evals: int) -> np.ndarray:
    """Log-rank z per sweep using the first n seeds of each group."""
    d0, c0 = _counts(b0[:, :n], n_evals)
    d1, c1 = _counts(b1[:, :n], n_evals)
    return logrank_counts(d0, c0, d1, c1)


def logrank_power(
    model: EscapeModel, n: int, alpha: float = 0.05, sided: int = 2, sims: int = 4000, seed: int = 0
) -> float:
    """Simulated power of the fixed-n log-rank test."""
    rng = np.random.default_rng(seed)
    b0, b1 = model.draw(rng, sims, n)
    z = logrank_z_sims(b0, b1, n, model.n_evals)
    crit = stats.norm.isf(alpha / sided)
    return float(np.mean(np.abs(z) >= crit if sided == 2 else z >= crit))


def logrank_sample_size(
    model: EscapeModel,
    alpha: float = 0.05,
    power: float = 0.8,
    sided: int = 2,
    sims: int = 4000,
    seed: int = 0,
    n_max: int = 400,
) -> FixedSize:
    """Smallest n per group whose simulated log-rank power reaches target (common random numbers)."""
    rng = np.random.default_rng(seed)
    _, n_sch = schoenfeld_n(model.h0, model.h1, model.budget, alpha, power, sided)
    pool = int(min(n_max, max(20, 3 * math.ceil(n_sch) + 10)))
    b0, b1 = model.draw(rng, sims, pool)
    crit = stats.norm.isf(alpha / sided)
    curve: list[tuple[int, float]] = []
    first = None
    for n in range(2, pool + 1):
        z = logrank_z_sims(b0, b1, n, model.n_evals)
        pw = float(np.mean(np.abs(z) >= crit if sided == 2 else z >= crit))
        curve.append((n, pw))
        if pw >= power:
            first = n
            break
    return FixedSize(first, curve[-1][1] if first else None, None, curve[-1][0], curve)


def logrank_sequential(
    model: EscapeModel,
    looks: Sequence[int],
    alpha: float = 0.05,
    spending: str = "obrien_fleming",
    sided: int = 2,
    sims: int = 4000,
    seed: int = 0,
) -> SequentialResult:
    """Simulated operating characteristics of the group-sequential log-rank design (H0: both at h0)."""
    looks = list(looks)
    b = spending_boundaries([n / looks[-1] for n in looks], alpha, spending=spending, sided=sided)
    out = []
    for null in (False, True):
        rng = np.random.default_rng(seed + (1 if null else 0))
        b0, b1 = model.draw(rng, sims, looks[-1], null=null)
        alive = np.ones(sims, dtype=bool)
        rej = np.zeros(sims, dtype=bool)
        stop = np.zeros(len(looks))
        for k, n in enumerate(looks):
            z = logrank_z_sims(b0, b1, n, model.n_evals)
            cross = (np.abs(z) >= b.z[k] if sided == 2 else z >= b.z[k]) & alive
            rej |= cross
            if k == len(looks) - 1:
                stop[k] = alive.mean()
            else:
                stop[k] = cross.mean()
            alive &= ~cross
        out.append((float(rej.mean()), stop))
    (pw, s1), (size, s0) = out
    ln = np.asarray(looks, dtype=float)
    return SequentialResult(
        looks,
        b.z,
        pw,
        size,
        s1.tolist(),
        s0.tolist(),
        float(s1 @ ln),
        float(s0 @ ln),
        f"simulation ({sims} sweeps, seed {seed})",
    )
