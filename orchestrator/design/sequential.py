"""Group-sequential seeds: the spec block, its validation, and the per-look decision.

A sweep with a ``sequential`` block runs seeds in looks (``looks[k]`` seeds per group complete
at look k) and, after each look, tests one pre-declared two-group contrast per stratum. The
contrast is stopped at the first look whose statistic crosses its Lan–DeMets boundary
(``boundaries.spending_boundaries``); the boundaries are computed for the planned information
fractions ``looks[k] / looks[-1]``. Every seed runs to its full budget, so at look k each group
holds exactly ``looks[k]`` complete observations: for lock-in at budget the information is
proportional to seeds exactly, for log-rank it is proportional in expectation (events per seed
do not depend on the look), which is what the seed-based fractions assume.

Conservatism of exact tests: Fisher's exact test is discrete, so the attainable p-values jump
and P(p <= nominal level) is at most the nominal level, usually below it. Each look's nominal
level is therefore conservative, and so is the design's overall type-I error; the boundaries
assume a continuous normal statistic, so the alpha actually spent is below the alpha stated.
The log-rank test is not exact: it is a normal approximation, and with the textbook
(hypergeometric) variance it is anti-conservative at these seed counts, so the permutation
variance is used (stats.logrank_counts). tests/test_design_sequential.py measures the type-I
error of both sequential procedures by simulation.

Multiplicity: with strata (e.g. one contrast per K), each stratum is its own group-sequential
test, decided and stopped on its own, run at level alpha / S for S strata (Bonferroni). Bonferroni
is valid under any dependence between strata and keeps each stratum's design independent of the
others' outcomes; Holm would need alpha recycled across strata between looks (Maurer & Bretz
2013), which couples the strata's stopping and is not worth it for a handful of strata.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, PositiveInt, ValidationError

from orchestrator.errors import UserError

if TYPE_CHECKING:
    from orchestrator.design.boundaries import Boundaries


class SequentialError(UserError):
    """A bad ``sequential`` block: one line naming the field."""


class Compare(BaseModel):
    model_config = ConfigDict(extra="forbid")
    by: str
    groups: list[Any]


class SequentialSpec(BaseModel):
    """The ``sequential:`` block of a sweep spec."""

    model_config = ConfigDict(extra="forbid")
    compare: Compare
    test: Literal["fisher", "logrank"]
    looks: list[PositiveInt]
    alpha: float = 0.05
    spending: Literal["obrien_fleming", "pocock"] = "obrien_fleming"
    strata: list[str] | None = None
    # 2: either group may be better; 1: only groups[0] better than groups[1] counts.
    sided: Literal[1, 2] = 2

    @property
    def fractions(self) -> list[float]:
        return [n / self.looks[-1] for n in self.looks]


def _fail(where: str, msg: str) -> SequentialError:
    return SequentialError(f"sequential.{where}: {msg}" if where else f"sequential: {msg}")


def parse_sequential(block: Any) -> SequentialSpec:
    """Parse the block alone (no axes): types, names, alpha range, looks order."""
    if not isinstance(block, Mapping):
        raise _fail("", f"must be a mapping, got {type(block).__name__}")
    try:
        spec = SequentialSpec.model_validate(dict(block))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise _fail(loc, err["msg"]) from None
    if len(spec.compare.groups) != 2:
        raise _fail("compare.groups", f"needs exactly 2 groups, got {len(spec.compare.groups)}")
    if spec.compare.groups[0] == spec.compare.groups[1]:
        raise _fail("compare.groups", f"the two groups are the same ({spec.compare.groups[0]!r})")
    if not 0 < spec.alpha < 0.5:
        raise _fail("alpha", f"must be in (0, 0.5), got {spec.alpha}")
    if not spec.looks:
        raise _fail("looks", "needs at least one look")
    for a, b in zip(spec.looks, spec.looks[1:]):
        if b <= a:
            raise _fail("looks", f"must be strictly increasing, got {spec.looks}")
    return spec


def validate_sequential(block: Any, axes: Mapping[str, Sequence[Any]], *, seed_axis: str = "seed") -> SequentialSpec:
    """Parse the block and check it against the spec's axes (name -> list of values).

    Raises SequentialError (one line) when the compared axis or its groups are missing, the
    last look needs more seeds than the seed axis has, or another axis varies without being
    stated as a stratum.
    """
    spec = parse_sequential(block)
    by = spec.compare.by
    if by not in axes:
        raise _fail("compare.by", f"axis {by!r} is not in the spec's axes ({', '.join(axes)})")
    if by == seed_axis:
        raise _fail("compare.by", f"cannot compare across the seed axis {seed_axis!r}")
    values = list(axes[by])
    for g in spec.compare.groups:
        if g not in values:
            raise _fail("compare.groups", f"{g!r} is not a value of axis {by!r} ({values})")
    if seed_axis not in axes:
        raise _fail("", f"the spec has no {seed_axis!r} axis to add seeds along")
    n_seeds = len(list(axes[seed_axis]))
    if spec.looks[-1] > n_seeds:
        raise _fail("looks", f"last look needs {spec.looks[-1]} seeds per group but axis {seed_axis!r} has {n_seeds}")
    strata = spec.strata or []
    for s in strata:
        if s not in axes:
            raise _fail("strata", f"axis {s!r} is not in the spec's axes ({', '.join(axes)})")
        if s in (by, seed_axis):
            raise _fail("strata", f"{s!r} cannot be a stratum (it is the compared or the seed axis)")
    if len(set(strata)) != len(strata):
        raise _fail("strata", f"repeated axis in {strata}")
    for name, vals in axes.items():
        if name in (by, seed_axis) or name in strata:
            continue
        if len(list(vals)) > 1:
            raise _fail(
                "strata",
                f"axis {name!r} varies ({len(list(vals))} values) but is not "
                f"a stated stratum; add it to strata: [...] or fix its value",
            )
    return spec


def strata_cells(spec: SequentialSpec, axes: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """One dict per contrast (the strata axes' values); ``[{}]`` when unstratified."""
    names = spec.strata or []
    return [dict(zip(names, combo)) for combo in itertools.product(*(list(axes[n]) for n in names))]


def contrast_alpha(spec: SequentialSpec, n_contrasts: int) -> float:
    """Bonferroni: each of the S strata's contrasts runs at alpha / S."""
    return spec.alpha / max(1, n_contrasts)


@lru_cache(maxsize=256)
def _bounds(fractions: tuple[float, ...], alpha: float, spending: str, sided: int) -> Boundaries:
    # Imported here: the boundaries need scipy (about a second to import), and every driver
    # imports this module for the design's types, sequential sweep or not.
    from orchestrator.design.boundaries import spending_boundaries

    return spending_boundaries(fractions, alpha, spending=spending, sided=sided)


def design_boundaries(spec: SequentialSpec, n_contrasts: int = 1) -> Boundaries:
    """The boundaries every contrast of this design uses (Bonferroni-split alpha)."""
    return _bounds(tuple(spec.fractions), contrast_alpha(spec, n_contrasts), spec.spending, spec.sided)


def _information(n0: int, n1: int, n_max: int) -> float:
    """Information fraction of a two-group comparison with n0 and n1 seeds (planned: n_max each)."""
    return 2.0 * n0 * n1 / ((n0 + n1) * n_max)


@dataclass
class FisherData:
    """Lock-in at budget for one group: ``successes`` of ``n`` seeds locked in."""

    n: int
    successes: int


@dataclass
class SurvivalData:
    """Escape times for one group: time = escape step, or the budget when it never escaped."""

    times: list[float]
    events: list[bool]

    @property
    def n(self) -> int:
        return len(self.times)


@dataclass
class LookRecord:
    """What one look decided, as stored and shown (``orchestrator analyze SWEEP sequential``)."""

    look: int  # 1-based
    n: dict[str, int]  # seeds per group tested at this look
    statistic: float  # z (> 0: groups[0] better — higher lock-in, or faster escape)
    p: float  # the test's own p-value (two-sided, or one-sided when sided=1)
    boundary: float  # |z| >= boundary stops (z >= boundary one-sided)
    nominal_alpha: float  # the boundary as a p threshold for this look alone
    alpha_spent: float  # cumulative alpha spent by this look (of this contrast's alpha)
    decision: Literal["continue", "reject", "accept"]  # reject/accept both stop
    seeds_saved: int  # seeds (all groups) not run because of this decision
    stratum: dict[str, Any] = field(default_factory=dict)
    variance: str | None = None  # the log-rank's variance (None: Fisher, or a record stored before it was kept)

    @property
    def stopped(self) -> bool:
        return self.decision != "continue"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fisher(spec: SequentialSpec, a: FisherData, b: FisherData) -> tuple[float, float]:
    from scipy.stats import fisher_exact

    from orchestrator.design.stats import z_from_p

    for g in (a, b):
        if not 0 <= g.successes <= g.n or g.n < 1:
            raise ValueError(f"fisher data needs 0 <= successes <= n and n >= 1, got {g}")
    table = [[a.successes, a.n - a.successes], [b.successes, b.n - b.successes]]
    alt = "two-sided" if spec.sided == 2 else "greater"
    p = float(fisher_exact(table, alternative=alt).pvalue)
    diff = a.successes / a.n - b.successes / b.n
    return float(z_from_p(p, diff, spec.sided)), p


def _logrank(spec: SequentialSpec, a: SurvivalData, b: SurvivalData, method: str) -> tuple[float, float, str]:
    from orchestrator.design.stats import logrank_test

    for g in (a, b):
        if g.n < 1 or len(g.events) != g.n:
            raise ValueError("log-rank data needs >= 1 seed per group and one event flag per time")
    # The log-rank `orchestrator analyze logrank` reports (its variance named by the analysis
    # config's `logrank`; see stats.logrank_counts for why the permutation one at these seeds).
    res = logrank_test(a.times, a.events, b.times, b.events, method=method, sided=spec.sided)
    return res.z, res.p, res.method


def decide_look(
    spec: SequentialSpec,
    look: int,
    data: Mapping[Any, FisherData | SurvivalData],
    prior: Sequence[LookRecord] = (),
    *,
    n_contrasts: int = 1,
    stratum: Mapping[str, Any] | None = None,
    logrank: str = "auto",
) -> LookRecord:
    """Test one contrast at look ``look`` (1-based) and decide: continue, reject (stop), accept (last look).

    ``data`` maps each of ``spec.compare.groups`` to that group's data at this look (its first
    ``looks[look-1]`` seeds); ``prior`` is the record of looks 1..look-1 of this contrast, which
    must all have continued (a decided contrast is never re-tested, so a resumed sweep cannot
    re-test with different data). The statistic is the log-rank z (the variance ``logrank`` names:
    :func:`orchestrator.design.stats.logrank_test`, as the analysis reports it), or for Fisher the z with the
    exact test's p (``Phi^-1(1 - p/2)`` signed by the rate difference); Fisher's discreteness
    makes the nominal levels conservative (see the module docstring).
    """
    if not 1 <= look <= len(spec.looks):
        raise ValueError(f"look {look} out of range 1..{len(spec.looks)}")
    if len(prior) != look - 1:
        raise ValueError(f"look {look} needs the record of {look - 1} prior look(s), got {len(prior)}")
    for r in prior:
        if r.stopped:
            raise ValueError(f"contrast already decided at look {r.look} ({r.decision})")
    g0, g1 = spec.compare.groups
    missing = [g for g in (g0, g1) if g not in data]
    if missing:
        raise ValueError(f"no data for group(s) {missing}")
    a, b = data[g0], data[g1]
    if a.n > spec.looks[look - 1] or b.n > spec.looks[look - 1]:
        raise ValueError(f"look {look} plans {spec.looks[look - 1]} seeds per group, got {a.n} and {b.n}")
    if spec.test == "fisher":
        if not (isinstance(a, FisherData) and isinstance(b, FisherData)):
            raise ValueError("test fisher needs FisherData for both groups")
        z, p = _fisher(spec, a, b)
        variance = None
    else:
        if not (isinstance(a, SurvivalData) and isinstance(b, SurvivalData)):
            raise ValueError("test logrank needs SurvivalData for both groups")
        z, p, variance = _logrank(spec, a, b, logrank)
    k = look - 1
    # Lan-DeMets at the information actually observed: seeds that failed shrink this look's
    # fraction (two-sample information is proportional to n0·n1/(n0+n1)); the last look spends
    # whatever alpha is left. With every planned seed present these are looks[k] / looks[-1].
    fractions = [_information(r.n[str(g0)], r.n[str(g1)], spec.looks[-1]) for r in prior]
    last = look == len(spec.looks)
    fractions.append(1.0 if last else _information(a.n, b.n, spec.looks[-1]))
    if any(y <= x for x, y in zip(fractions, fractions[1:])):
        raise ValueError(f"look {look} adds no information over the previous look ({a.n}, {b.n} seeds)")
    bounds = _bounds(
        tuple(round(f, 12) for f in fractions), contrast_alpha(spec, n_contrasts), spec.spending, spec.sided
    )
    crossed = abs(z) >= bounds.z[k] if spec.sided == 2 else z >= bounds.z[k]
    decision: Literal["continue", "reject", "accept"] = "reject" if crossed else ("accept" if last else "continue")
    saved = (spec.looks[-1] - spec.looks[k]) * 2 if decision != "continue" else 0
    return LookRecord(
        look=look,
        n={str(g0): a.n, str(g1): b.n},
        statistic=z,
        p=p,
        boundary=bounds.z[k],
        nominal_alpha=bounds.nominal_alpha[k],
        alpha_spent=bounds.cumulative_alpha[k],
        decision=decision,
        seeds_saved=saved,
        stratum=dict(stratum or {}),
        variance=variance,
    )


def stratum_key(spec: SequentialSpec, cell: Mapping[str, Any]) -> tuple:
    """A hashable key for one stratum (its strata axes' values, in the block's order)."""
    return tuple(cell[name] for name in (spec.strata or []))


def decide_strata(
    spec: SequentialSpec,
    axes: Mapping[str, Sequence[Any]],
    look: int,
    data: Mapping[tuple, Mapping[Any, FisherData | SurvivalData]],
    prior: Mapping[tuple, Sequence[LookRecord]],
    logrank: str = "auto",
) -> dict[tuple, LookRecord]:
    """Decide every still-open stratum's contrast at ``look``; each at alpha / S (Bonferroni).

    Strata already decided at an earlier look are left out of the result (their seeds are not
    run any more); a stratum still open must have data for this look.
    """
    cells = strata_cells(spec, axes)
    out: dict[tuple, LookRecord] = {}
    for cell in cells:
        key = stratum_key(spec, cell)
        rec = list(prior.get(key, ()))
        if any(r.stopped for r in rec):
            continue
        if key not in data:
            raise ValueError(f"no data for open stratum {cell} at look {look}")
        out[key] = decide_look(spec, look, data[key], rec, n_contrasts=len(cells), stratum=cell, logrank=logrank)
    return out


def format_records(records: Sequence[LookRecord]) -> str:
    """The look-by-look table shown by the analysis and the report."""
    if not records:
        return "(no looks yet)"
    groups = list(records[0].n)
    head = (
        f"{'stratum':<14} {'look':>4} "
        + " ".join(f"{'n ' + g:>16}" for g in groups)
        + f" {'z':>7} {'p':>9} {'boundary':>8} {'nominal a':>9} {'a spent':>8} {'decision':<9} {'saved':>5}"
    )
    lines = [head]
    for r in records:
        st = ",".join(f"{k}={v}" for k, v in r.stratum.items()) or "-"
        lines.append(
            f"{st:<14} {r.look:>4} "
            + " ".join(f"{r.n[g]:>16}" for g in groups)
            + f" {r.statistic:>7.3f} {r.p:>9.3g} {r.boundary:>8.3f} {r.nominal_alpha:>9.3g}"
            f" {r.alpha_spent:>8.4f} {r.decision:<9} {r.seeds_saved:>5}"
        )
    return "\n".join(lines)
