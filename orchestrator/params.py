"""The parameters of one trial, as the training loop sees them.

A resolved trial config is a FLAT dict: top-level fields below, plus dotted names for the
pieces that belong to someone else: ``model.<knob>`` goes to ``cells.build``, ``task.<param>``
to ``tasks.build``, and ``tag.<label>`` is a free label the analysis can group by (it never
reaches the model or the data). Unknown top-level names are refused: a misspelt knob must
never be silently ignored in a 500-trial sweep.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

NAMESPACES = ("model", "task", "tag")

# Upper bounds no real study comes near, stated in the message that refuses a value past them
# (1.0e+300 is a finite float: an lr that large overflows the first update, and the trial
# would fail in its worker with a traceback instead of here with one line). The checked-in
# sweeps and the seed papers train at lr 3e-4 .. 1e-2 and weight decay 0 .. 0.1.
MAX_LR = 10.0
MAX_WEIGHT_DECAY = 10.0
MAX_GRAD_CLIP = 1e6
MAX_CHECKPOINT_EVERY_S = 86_400.0  # a day
MAX_THREADS = 256


def _at_most(bound: float, why: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if v is not None and v > bound:
            shown = f"{int(bound):,}" if bound == int(bound) else f"{bound:g}"
            raise ValueError(f"must be at most {shown} ({why})")
        return v

    return check


def _at_most_v(bound: float, why: str) -> AfterValidator:
    return AfterValidator(_at_most(bound, why))


class TrialParams(BaseModel):
    """Top-level trial parameters with their defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arm: str = Field(description="cell arm from the cells registry")
    task: str = Field(description="task name from the tasks registry")
    seed: int = Field(0, ge=0, description="model-init seed (and data seed unless data_seed)")
    data_seed: int | None = Field(None, ge=0, description="training-data stream seed; None = seed")
    eval_seed: int = Field(0, ge=0, description="seed of the fixed held-out set (shared by all seeds)")
    lr: Annotated[PositiveFloat, _at_most_v(MAX_LR, "far above any study's learning rate")] = 1e-3
    batch_size: PositiveInt = 64
    steps: PositiveInt = 1000
    eval_every: PositiveInt = 100
    schedule: Literal["constant", "cosine"] = "constant"
    cosine_steps: PositiveInt | None = Field(None, description="cosine period T; None = the budget (cosine-to-budget)")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    warmup_steps: int = Field(0, ge=0, description="linear warmup from 0 over this many steps")
    weight_decay: Annotated[float, _at_most_v(MAX_WEIGHT_DECAY, "far above any study's weight decay")] = Field(
        0.01, ge=0.0
    )
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.999, ge=0.0, lt=1.0)
    grad_clip: Annotated[float | None, _at_most_v(MAX_GRAD_CLIP, "null turns clipping off")] = Field(
        1.0, gt=0.0, description="max global grad norm; None = off"
    )
    d_model: PositiveInt | None = None
    n_layers: PositiveInt | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    fp32: bool = Field(False, description="force fp32 even where bf16 autocast is available")
    rebinding: bool = Field(False, description="also score the rebinding control at every eval")
    anneal: Literal["none", "time", "escape"] = Field("none", description="read-blend anneal (mlstm): whitened -> raw")
    anneal_frac: float = Field(0.3, gt=0.0, le=1.0, description="anneal length as a fraction of the budget")
    anneal_escape_at: float = Field(0.8, gt=0.0, le=1.0, description="escape-gated anneal starts at this eval acc")
    checkpoint_every_s: Annotated[float, _at_most_v(MAX_CHECKPOINT_EVERY_S, "a day")] = Field(
        30.0, ge=0.0, description="min seconds between checkpoints (0 = at every eval)"
    )
    threads: Annotated[PositiveInt | None, _at_most_v(MAX_THREADS, "torch threads of one trial")] = Field(
        None, description="torch CPU threads; None = the trial's cpu resources"
    )

    @model_validator(mode="after")
    def _check(self) -> TrialParams:
        if self.warmup_steps >= self.steps and self.warmup_steps > 0:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})")
        return self


TOP_LEVEL = tuple(TrialParams.model_fields)


def split(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(top-level, model knobs, task params, tags) of a flat resolved config."""
    top: dict[str, Any] = {}
    ns: dict[str, dict[str, Any]] = {n: {} for n in NAMESPACES}
    for name, value in params.items():
        head, dot, rest = name.partition(".")
        if dot and head in ns:
            ns[head][rest] = value
        else:
            top[name] = value
    return top, ns["model"], ns["task"], ns["tag"]


def resolve(params: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults of the top-level fields and return the flat resolved config
    (sorted namespaces after the top level). Raises pydantic.ValidationError."""
    top, model, task, tag = split(params)
    tp = TrialParams.model_validate(top)
    out = tp.model_dump()
    out.update({f"model.{k}": v for k, v in sorted(model.items())})
    out.update({f"task.{k}": v for k, v in sorted(task.items())})
    out.update({f"tag.{k}": v for k, v in sorted(tag.items())})
    return out


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become dotted names: {"model": {"conv": 4}} -> {"model.conv": 4}."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_params(v, prefix=f"{name}."))
        else:
            out[name] = v
    return out
