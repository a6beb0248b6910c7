"""What a spec may say: its pydantic schema (the sweep, its resources, budget, stop rule and
blocks), the validated ``Sweep`` it loads into, and the one-line ``SpecError`` every check raises."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.analysis_config import AnalysisConfig
from orchestrator.design.matching import MatchParams
from orchestrator.errors import UserError
from orchestrator.keys import spec_hash


class SpecError(UserError):
    """A spec that cannot run; the message is ``FILE: KEY.PATH: what was expected``."""


# Bounds of the sweep-level numbers (a trial's own are in orchestrator.params).
MAX_CPU = 1024  # CPUs of one trial
MAX_GPU = 64  # GPUs of one trial
MAX_RETRIES = 100  # a trial failing more often than this is failing for a reason


def _not_bool(cls, v: Any) -> Any:
    """YAML's ``true`` is not a count (pydantic would take it as 1)."""
    if isinstance(v, bool):
        raise ValueError("expected a number")
    return v


# Ray's accelerator types (``accelerator_type:A100`` on a node): letters, digits, - and _.
_ACCELERATOR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


MIN_RESOURCE = 0.01  # the smallest CPU or GPU share a trial may ask for


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu: float = Field(
        1.0, ge=MIN_RESOURCE, le=MAX_CPU, description="CPUs per trial (also torch threads, rounded down)"
    )
    gpu: float | Literal["auto"] = Field(
        0.0,
        description="GPU fraction per trial (0.25 = four share a GPU), or auto: the fraction the trial's "
        "estimated GPU memory takes of the GPU it lands on",
    )
    accelerator: list[str] | None = Field(
        None,
        description="Ray accelerator type(s) a trial may run on (A100, or a list); needs gpu > 0 or auto",
    )

    _not_bool = field_validator("cpu", "gpu", mode="before")(_not_bool)

    @field_validator("cpu", "gpu")
    @classmethod
    def _ray_granularity(cls, v: Any) -> Any:
        # Ray keeps resource amounts to 4 decimals; a fraction finer than that is not a
        # request it can place (1e-300 CPUs ended in a Tune internal error with trials pending).
        if isinstance(v, float) and v > 0:
            if v < MIN_RESOURCE:
                raise ValueError(f"must be at least {MIN_RESOURCE} (or 0 for gpu), got {v:g}")
            return round(v, 4)
        return v

    @field_validator("gpu", mode="before")
    @classmethod
    def _auto_or_number(cls, v: Any) -> Any:
        if isinstance(v, str) and v != "auto":
            raise ValueError("expected a GPU fraction (a number) or auto")
        return v

    @field_validator("accelerator", mode="before")
    @classmethod
    def _one_or_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("accelerator")
    @classmethod
    def _accelerator_names(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("expected an accelerator type or a non-empty list of them")
        for name in v:
            if not _ACCELERATOR.match(name):
                raise ValueError(f"{name!r} is not an accelerator type (like A100, G1070, H100)")
        return list(dict.fromkeys(v))

    @field_validator("cpu")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("expected a finite number")
        return v

    @field_validator("gpu")
    @classmethod
    def _gpu_fraction(cls, v: float | str) -> float | str:
        if v == "auto":
            return v
        assert isinstance(v, float)
        if not math.isfinite(v):
            raise ValueError("expected a finite number")
        if v < 0 or v > MAX_GPU:
            raise ValueError(f"expected auto or a number from 0 to {MAX_GPU}")
        if v > 1 and v != int(v):
            raise ValueError("a GPU fraction above 1 must be a whole number of GPUs")
        return v

    @model_validator(mode="after")
    def _accelerator_needs_gpu(self) -> Resources:
        if self.accelerator and self.gpu == 0:
            raise ValueError("accelerator needs a GPU: set gpu to a fraction or auto")
        return self


class Budget(BaseModel):
    """Sugar for the training-budget parameters; merged into ``fixed``."""

    model_config = ConfigDict(extra="forbid")

    steps: PositiveInt | None = None
    eval_every: PositiveInt | None = None
    schedule: Literal["constant", "cosine"] | None = None
    cosine_steps: PositiveInt | None = None
    warmup_steps: int | None = Field(None, ge=0)
    min_lr_ratio: float | None = Field(None, ge=0, le=1)


AxisValues = list[Any] | str


class StopSpec(BaseModel):
    """``stop: {after_escape_evals: N}``: end a trial N evals after its sustained escape."""

    model_config = ConfigDict(extra="forbid")
    after_escape_evals: PositiveInt
    escape_at: float | None = Field(
        None, gt=0, le=1, description="accuracy that counts as escaped; default: the analysis block's escape_at"
    )


class Block(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fixed: dict[str, Any] = Field(default_factory=dict)
    axes: dict[str, AxisValues] = Field(default_factory=dict)
    zip: list[list[str]] = Field(default_factory=list)
    exclude: list[dict[str, Any]] = Field(default_factory=list)


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", max_length=200)
    description: str | None = None
    fixed: dict[str, Any] = Field(default_factory=dict)
    axes: dict[str, AxisValues] = Field(default_factory=dict)
    zip: list[list[str]] = Field(default_factory=list)
    exclude: list[dict[str, Any]] = Field(default_factory=list)
    blocks: list[Block] = Field(default_factory=list)
    budget: Budget = Field(default_factory=Budget)
    resources: Resources = Field(default_factory=Resources)
    max_concurrent: PositiveInt | None = None
    retries: int = Field(0, ge=0, le=MAX_RETRIES)
    storage: str | None = Field(None, description="database URL; --db overrides")
    checkpoint_dir: str | None = None
    # What a trial keeps once it has ended (completed or diverged): ``final``, its last
    # checkpoint (a longer budget continues it; its weights can be studied); ``none``, nothing
    # (deleted with the stored end; a longer budget retrains it from step 0).
    keep_checkpoints: Literal["final", "none"] = "final"
    pack_seeds: PositiveInt | Literal["auto"] = 1
    analysis: dict[str, Any] | None = None
    # Designs (orchestrator/design): per-arm harness sizing, group-sequential seeds, and
    # stopping a trial at its event. `sequential` is checked against the axes in `load`.
    match_params: MatchParams | None = None
    sequential: dict[str, Any] | None = None
    stop: StopSpec | None = None
    # Modules registering the sweep's own cells/tasks (orchestrator.plugins).
    plugins: list[str] = Field(default_factory=list)

    _not_bool = field_validator("retries", "max_concurrent", "pack_seeds", mode="before")(_not_bool)

    @field_validator("storage")
    @classmethod
    def _storage_scheme(cls, v: str | None) -> str | None:
        if v is not None:
            # Imported here: the store loads SQLAlchemy and Alembic, which a spec without
            # storage: never needs. Empty or in-memory storage would store nothing queryable.
            from orchestrator.store.dialect import for_value, storage_problem

            if "://" in v and for_value(v) is None:
                raise ValueError("expected a file path, sqlite:///PATH or postgresql://HOST/DB")
            problem = storage_problem(v)
            if problem is not None:
                raise ValueError(problem.removeprefix("is "))
        return v

    @model_validator(mode="after")
    def _analysis(self) -> SweepSpec:
        if self.analysis is not None:
            # Imported here: the analysis package loads pandas and the statistics, which
            # every CLI start and the runner import this module without needing.
            from orchestrator.analysis_config import AnalysisConfig

            AnalysisConfig.model_validate(self.analysis)
        return self


@dataclass
class Sweep:
    """A validated spec and its expanded trials, in a stable order."""

    spec: SweepSpec
    path: Path | None
    text: str
    trials: list[tuple[str, dict[str, Any]]]  # (key, resolved params)
    axes: dict[str, list[Any]] = field(default_factory=dict)
    # match_params: one row per distinct sized model ({arm, params, state_elements, mlp_hidden, ...})
    matched: list[dict[str, Any]] = field(default_factory=list)
    sequential: Any = None  # design.sequential.SequentialSpec when the spec has the block
    # The spec's analysis block, whole: the runner's looks and the stop rule decide on the
    # events the analysis reports (orchestrator/events.py), under the same configuration.
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    # Things worth saying that do not stop the sweep (an exclude matching nothing, a
    # password in the spec); the CLI prints them on stderr.
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def hash(self) -> str:
        return spec_hash(self.text)


# ---- errors ------------------------------------------------------------------------------


def _loc(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def first_error(exc: ValidationError, prefix: str = "") -> tuple[str, str]:
    err = exc.errors()[0]
    loc = [p for p in err["loc"] if p not in ("list[any]", "str", "function-after[_check(), TrialParams]")]
    where = _loc(loc)
    if prefix:
        where = f"{prefix}.{where}" if loc else prefix
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required key is missing"
    if "input" in err and err["type"] not in ("extra_forbidden", "missing"):
        msg += f", got {err['input']!r}"
    return where, msg


Fail = Callable[[str, str], NoReturn]


def failer(label: str) -> Fail:
    """The ``fail(where, msg)`` every check calls: a SpecError ``LABEL: WHERE: MSG``."""

    def fail(where: str, msg: str) -> NoReturn:
        raise SpecError(f"{label}: {where}: {msg}")

    return fail
