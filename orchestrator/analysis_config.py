"""The options of every analysis: what it reads, how it groups trials and which thresholds
define its events (:class:`AnalysisConfig`).

One model, three doors, the same names: a sweep spec's ``analysis:`` block, the options of
``orchestrator analyze`` and ``orchestrator report`` (one per field, generated from it by
:mod:`orchestrator.cli.analysis_options`, help text from the field's description) and the
keywords of :func:`orchestrator.analyze` / :func:`orchestrator.report`. Options given on the
command line or from Python override the spec's block field by field. It lives outside the
analysis package so the CLI can build its options without loading the statistics.

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
- ``diverged``: how a trial whose trace went non-finite counts (see
  :mod:`orchestrator.analysis.diverged`): ``at-risk`` (default, as published survival
  analyses of such traces count it) keeps it at risk until its last eval with a finite
  accuracy; ``censor`` censors it at divergence, its first point with a non-finite loss (or
  without a finite accuracy).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.errors import UserError, utf8_problem
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


def _mapping(v: Any) -> Any:
    """Accept ``"x=lr,y=vocab_size"`` as well as a mapping (a CLI option is one string); an
    empty value is null."""
    if not isinstance(v, str):
        return v
    out: dict[str, str | None] = {}
    for part in v.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"expected key=value pairs separated by commas, got {v!r}")
        out[key.strip()] = value.strip() or None
    return out


# Names a spec's analysis: block (or a Python keyword) used before; still read. Stored specs
# keep them, so the block reads them without a word; Python keywords warn (with_overrides).
OLD_NAMES = {"cells": "strata"}


class AnalysisConfig(BaseModel):
    """Options of every analysis; see the module docstring for the event definitions. Each
    field is an option of ``orchestrator analyze`` and ``report`` under the same name, its
    description the option's help."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    by: list[str] = Field(default_factory=list, description="parameters whose values form the groups, comma-separated")
    strata: list[str] = Field(
        default_factory=list,
        description="parameters that stratify the tables and tests, comma-separated; the last one is the "
        "report table's column",
    )
    where: str | None = Field(
        None, description="SQL condition on trial parameters, e.g. \"vocab_size = 88 AND variant = 'ns5'\""
    )
    statuses: list[str] = Field(
        default_factory=lambda: list(DEFAULT_STATUSES),
        description="trial statuses analysed, comma-separated, or 'all'",
    )
    metric: Literal["final", "best"] = Field("final", description="final or best eval accuracy for lock-in")
    lockin: float = Field(0.8, ge=0.0, le=1.0, description="lock-in / solved threshold")
    mid_at: float = Field(0.2, ge=0.0, le=1.0, description="'mid' outcome threshold on final accuracy")
    escape_at: float = Field(0.8, ge=0.0, le=1.0, description="escape accuracy threshold")
    collapse_below: float = Field(0.005, ge=0.0, le=1.0, description="collapse threshold")
    formula: str | None = Field(
        None, description="right-hand side of the hazard formula, e.g. 'np.log(t) + C(lr) + C(variant)'"
    )
    link: Literal["logit", "cloglog"] = Field("logit", description="link of the hazard model: logit or cloglog")
    compare: list[str] | None = Field(None, description="the two group labels a contrast compares: A,B")
    pair_on: list[str] = Field(
        default_factory=lambda: ["seed"], description="parameters pairing McNemar's trials, comma-separated"
    )
    alternative: Literal["two-sided", "greater", "less"] = Field(
        "two-sided", description="two-sided, greater (the first group higher) or less"
    )
    # Holm by default: a table's tests share trials (Fisher and permutation on the same
    # groups), and Holm holds the family-wise error under any dependence; BH is for screens.
    adjust: Literal["holm", "bh", "bonferroni", "none"] = Field(
        "holm",
        description="multiplicity adjustment within each family of p-values a command prints (the "
        "per-stratum log-rank tests, the report's contrast table): holm, bh (Benjamini-Hochberg), "
        "bonferroni or none; a single test is left as it is. Raw p-values are shown beside",
    )
    n_resamples: int = Field(100_000, gt=0, description="permutation resamples (exact when fewer relabellings exist)")
    random_seed: int = Field(0, description="random seed of Monte Carlo permutations")
    heatmap: HeatmapConfig | None = Field(
        None, description="the basin-map figure: x=PARAM,y=PARAM[,facet=PARAM]; x is lr when not given"
    )
    contrasts: list[list[str]] = Field(
        default_factory=list,
        description="pairs of group labels (A,B) compared within each stratum (pooled without strata): "
        "Fisher on lock-in, permutation on mean accuracy, log-rank, and exact "
        "McNemar when the two groups share every pairing key",
    )
    horizon: PositiveInt | None = Field(
        None, description="cut every trace at this step first (e.g. 'solved at step 2000' of longer runs)"
    )
    stopped_as: Literal["solved"] | None = Field(
        None,
        description="trials ended by the spec's stop rule have no lock-in at budget or "
        "final accuracy; 'solved' imputes them as solved (locked in)",
    )
    scaling: ScalingConfig | None = Field(
        None,
        description="the recall-scaling columns and treatment: D=,N=,Nf=,V=,layers=,seeds=,floor= "
        "(defaults d_model, d_state, n_facts, vocab_size, n_layers, best, table)",
    )
    diverged: Literal["at-risk", "censor"] = Field(
        "at-risk",
        description="a trial whose trace went non-finite: 'at-risk' until its last eval with a finite "
        "accuracy (as published survival analyses count it), or 'censor' at divergence (its first "
        "point with a non-finite loss)",
    )

    logrank: Literal["auto", "permutation", "hypergeometric"] = Field(
        "auto",
        description="variance of the two-group log-rank, for reports and sequential looks alike: "
        "'permutation' (holds its level with few seeds and tied escapes), 'hypergeometric' (the "
        "textbook one, lifelines'), or 'auto' (permutation while a group has under 30 trials or "
        "the escapes are heavily tied)",
    )

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in OLD_NAMES.items():
                if old in data:
                    if new in data:
                        raise ValueError(f"{old} is the old name of {new}: give one of them")
                    data = {(new if k == old else k): v for k, v in data.items()}
        return data

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # `report --json`, `analyze scaling --json` and the HTML report echo the config; they
        # have always said "cells" for the strata, and their output does not change.
        return {("cells" if k == "strata" else k): v for k, v in handler(self).items()}

    _lists = field_validator("by", "strata", "statuses", "pair_on", mode="before")(_name_list)
    _mappings = field_validator("heatmap", "scaling", mode="before")(_mapping)

    @field_validator("where", "formula")
    @classmethod
    def _utf8(cls, v: str | None, info: Any) -> str | None:
        # An argument with bytes that are not UTF-8 arrives as lone surrogates.
        bad = None if v is None else utf8_problem(v, f"--{info.field_name}")
        if bad:
            raise ValueError(bad)
        return v

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
        """A copy with every override that is not None applied (options over the spec's
        block); an old name (:data:`OLD_NAMES`) still works, with a DeprecationWarning."""
        given = {k: v for k, v in overrides.items() if v is not None}
        for old, new in OLD_NAMES.items():
            if old in given:
                warnings.warn(f"{old}= is deprecated, use {new}=", DeprecationWarning, stacklevel=_caller_level())
                if new in given:
                    raise UserError(f"options: {old} is the old name of {new}: give one of them")
                given[new] = given.pop(old)
        return parse_config({**dict(self), **given}, source="options")


def _caller_level() -> int:
    """The ``stacklevel`` of the first caller outside this package, so a deprecation is
    attributed to (and, in a script or notebook, shown at) the user's line."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("orchestrator."):
        frame, level = frame.f_back, level + 1
    return level


def parse_config(data: dict[str, Any] | None, source: str = "analysis") -> AnalysisConfig:
    """Validate a mapping (a spec's ``analysis:`` block, or merged options); a bad key or
    value is a one-line :class:`UserError` naming the field."""
    try:
        return AnalysisConfig.model_validate(data or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise UserError(f"{source}: {loc}: {err['msg']}") from None
