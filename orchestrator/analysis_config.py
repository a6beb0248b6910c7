"""What an analysis reads, how it groups trials and which thresholds define its events.

A sweep spec may carry an ``analysis:`` block validated by :class:`AnalysisConfig`; the CLI
flags of ``orchestrator analyze`` and ``orchestrator report`` override its fields one by one.

Conventions (the defaults reproduce the scaffold study's released analysis scripts):

- escape: the first eval after the trial's first eval with accuracy >= ``escape_at``;
- collapse: the first eval (after the first) from which accuracy stays below
  ``collapse_below`` to the trial's last eval;
- outcome classes, from the trial's final eval accuracy, checked in this order:
  ``solved`` (>= ``lockin``), ``dead`` (collapsed), ``mid`` (>= ``mid_at``), ``flat``;
- lock-in: accuracy >= ``lockin`` on the final eval (``metric="final"``) or on the best
  eval (``metric="best"``);
- ``horizon``: when set, every trace is cut at that step first (the evals after it are
  ignored), so "solved at step 2,000" of a 4,000-step run is one option away;
- ``diverged``: how a trial whose trace went non-finite counts (see :mod:`.diverged`):
  ``at-risk`` (default, as published survival analyses of such traces count it) keeps it at
  risk until its last eval with a finite accuracy; ``censor`` censors it at divergence, its
  first point with a non-finite loss (or without a finite accuracy).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from orchestrator.errors import UserError
from orchestrator.status import ALL, FINISHED

DEFAULT_STATUSES = tuple(s.value for s in FINISHED)
ALL_STATUSES = tuple(s.value for s in ALL)


def _name_list(v: Any) -> Any:
    """Accept ``"a,b"`` as well as ``["a", "b"]`` (CLI flags and YAML both stay short)."""
    if v is None:
        return []
    if isinstance(v, str):
        return [p.strip() for p in v.split(",") if p.strip()]
    return v


class HeatmapConfig(BaseModel):
    """Basin map: solved fraction per (x, y) cell, one panel per value of ``facet``."""

    model_config = ConfigDict(extra="forbid")

    x: str = "lr"
    y: str
    facet: str | None = None


class ScalingConfig(BaseModel):
    """Which trial parameters are the recall-scaling variables (seed 002) and how seeds and
    the chance floor are treated; see :mod:`orchestrator.analysis.scaling`."""

    model_config = ConfigDict(extra="forbid")

    D: str = Field("d_model", description="embedding (model) dimension")
    N: str = Field("d_state", description="state dimension per layer")
    Nf: str = Field("n_facts", description="facts (key-value pairs) in context")
    V: str = Field("vocab_size", description="vocabulary size")
    layers: str | None = Field("n_layers", description="multiplies N (N_eff = layers * N); null: N alone")
    seeds: Literal["best", "mean", "all"] = Field(
        "best",
        description="per grid point: best seed (the paper's existence reading), the "
        "mean, or every seed as its own point",
    )
    floor: Literal["table", "marginal", "none"] | float = Field(
        "table",
        description="accuracy floor the curve rises from: 1/Nf (guessing among the "
        "stored values), 1/(V - V//2) (value marginal), 0, or a number",
    )

    @field_validator("floor")
    @classmethod
    def _floor_range(cls, v: Any) -> Any:
        if isinstance(v, float) and not 0.0 <= v < 1.0:
            raise ValueError("a numeric floor must be in [0, 1)")
        return v


def _pairs(v: Any) -> Any:
    """``[[A, B], ...]``; a pair may also be written ``"A,B"``."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise ValueError("contrasts is a list of pairs of group labels, e.g. [[ns5, baseline]]")
    return [_name_list(p) if isinstance(p, str) else p for p in v]


class AnalysisConfig(BaseModel):
    """Options of every analysis; see the module docstring for the event definitions."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    by: list[str] = Field(default_factory=list, description="parameters whose values form the compared groups")
    cells: list[str] = Field(
        default_factory=list,
        description="parameters that stratify: per-cell tables and tests; the last one is the report table's column",
    )
    where: str | None = Field(None, description="SQL condition on trial parameters")
    statuses: list[str] = Field(default_factory=lambda: list(DEFAULT_STATUSES), description="trial statuses analysed")
    metric: Literal["final", "best"] = "final"
    lockin: float = Field(0.8, ge=0.0, le=1.0)
    mid_at: float = Field(0.2, ge=0.0, le=1.0)
    escape_at: float = Field(0.8, ge=0.0, le=1.0)
    collapse_below: float = Field(0.005, ge=0.0, le=1.0)
    formula: str | None = Field(None, description="right-hand side of the hazard formula")
    link: Literal["logit", "cloglog"] = "logit"
    compare: list[str] | None = Field(None, description="the two group labels a contrast uses")
    pair_on: list[str] = Field(default_factory=lambda: ["seed"])
    alternative: Literal["two-sided", "greater", "less"] = "two-sided"
    n_resamples: int = Field(100_000, gt=0)
    random_seed: int = 0
    heatmap: HeatmapConfig | None = None
    contrasts: list[list[str]] = Field(
        default_factory=list,
        description="pairs of group labels compared within each cell (pooled without cells): "
        "Fisher on lock-in, permutation on mean accuracy, log-rank, and exact "
        "McNemar when the two groups share every pairing key",
    )
    horizon: PositiveInt | None = Field(None, description="cut every trace at this step")
    stopped_as: Literal["solved"] | None = Field(
        None,
        description="trials ended by the spec's stop rule have no lock-in at budget or "
        "final accuracy; 'solved' imputes them as solved (locked in)",
    )
    scaling: ScalingConfig | None = None
    diverged: Literal["at-risk", "censor"] = Field(
        "at-risk",
        description="a trial whose trace went non-finite: 'at-risk' until its last eval with a finite "
        "accuracy (as published survival analyses count it), or 'censor' at divergence (its first "
        "point with a non-finite loss)",
    )

    _lists = field_validator("by", "cells", "statuses", "pair_on", mode="before")(_name_list)

    @field_validator("compare", mode="before")
    @classmethod
    def _compare_list(cls, v: Any) -> Any:
        return None if v is None else _name_list(v)

    @field_validator("compare")
    @classmethod
    def _two_groups(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (len(v) != 2 or v[0] == v[1]):
            raise ValueError("compare needs exactly two different group labels, e.g. baseline,ns5")
        return v

    @field_validator("contrasts", mode="before")
    @classmethod
    def _contrast_pairs(cls, v: Any) -> Any:
        return _pairs(v)

    @field_validator("contrasts")
    @classmethod
    def _contrasts_two(cls, v: list[list[str]]) -> list[list[str]]:
        for pair in v:
            if len(pair) != 2 or pair[0] == pair[1]:
                raise ValueError(f"each contrast names two different group labels, got {pair}")
        return v

    @field_validator("statuses")
    @classmethod
    def _known_statuses(cls, v: list[str]) -> list[str]:
        if v == ["all"]:
            return list(ALL_STATUSES)
        bad = [s for s in v if s not in ALL_STATUSES]
        if bad:
            raise ValueError(f"unknown status {bad[0]!r}; expected some of {', '.join(ALL_STATUSES)} or 'all'")
        return v

    @model_validator(mode="after")
    def _thresholds(self) -> AnalysisConfig:
        if self.mid_at > self.lockin:
            raise ValueError(f"mid_at ({self.mid_at}) must not exceed lockin ({self.lockin})")
        if self.collapse_below >= self.escape_at:
            raise ValueError(f"collapse_below ({self.collapse_below}) must be below escape_at ({self.escape_at})")
        return self

    def with_overrides(self, **overrides: Any) -> AnalysisConfig:
        """A copy with every override that is not None applied (CLI flags over the spec)."""
        data = self.model_dump()
        data.update({k: v for k, v in overrides.items() if v is not None})
        return parse_config(data, source="options")


def parse_config(data: dict[str, Any] | None, source: str = "analysis") -> AnalysisConfig:
    """Validate a mapping (a spec's ``analysis:`` block, or merged CLI options); a bad key or
    value is a one-line :class:`UserError` naming the field."""
    try:
        return AnalysisConfig.model_validate(data or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise UserError(f"{source}: {loc}: {err['msg']}") from None
