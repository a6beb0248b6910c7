"""Sweep specs (``sweeps/*.yaml``): validation and expansion into trials.

A spec crosses axes (any trial parameter, seeds included, ranges like ``seed: 0..9``) over
fixed parameters; ``zip`` ties axes that move together, ``exclude`` drops combinations, and
``blocks`` unions several such designs (for tables that are not one full product). Every
trial gets a stable key (hash of its resolved config). A bad spec raises ``SpecError`` with
one line naming the file, the key path and what was expected, before any trial starts and
before anything is written to a database.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, cast

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.analysis_config import AnalysisConfig, parse_config
from orchestrator.design.matching import MatchParams
from orchestrator.errors import UserError
from orchestrator.keys import spec_hash, trial_key
from orchestrator.params import NAMESPACES, TOP_LEVEL, TrialParams, resolve, split
from orchestrator.sources import MAX_SPEC_BYTES, read_text_file
from orchestrator.yaml_load import DuplicateKeyError, TagError, load_strict


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


def _first_error(exc: ValidationError, prefix: str = "") -> tuple[str, str]:
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


# ---- bounds -------------------------------------------------------------------------------

DEFAULT_MAX_TRIALS = 100_000
MAX_DEPTH = 32  # a spec is a few levels deep (blocks -> axes -> values)
MAX_NODES = 1_000_000  # values after alias expansion ("billion laughs" stops here)
# Typed columns of the store (trials.seed, steps, eval_every, batch_size, ...) are 32-bit
# INTEGER on PostgreSQL: a larger value would pass here and fail at the first write.
MAX_INT_FIELD = 2**31 - 1
MAX_KNOB_INT = 2**63 - 1  # anything in params is stored as JSON and a DOUBLE in trial_params
# A trial's memory: weights, gradients and two Adam moments in fp32 = 16 bytes a parameter.
BYTES_PER_PARAM = 16
# Far past any study (the papers train at batch 4..256 and evaluate every 10..200 steps), and
# bounded so a typo cannot ask for a 2-billion batch or a billion eval rows per trial.
MAX_BATCH_SIZE = 65_536
MAX_EVALS_PER_TRIAL = 100_000


def _node_memory_bytes() -> int:
    """Physical memory of this machine: the bound for one trial (``$ORCH_NODE_MEMORY_BYTES``
    overrides it, e.g. for the largest node of a cluster submitted to from a laptop)."""
    env = os.environ.get("ORCH_NODE_MEMORY_BYTES")
    if env and env.isdigit():
        return int(env)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB" if n < 1e12 else f"{n / 1e12:.3g} TB"


def _shape(raw: Any) -> None:
    """Depth and size of the loaded YAML, walked iteratively (aliases count every time they
    are used, so an alias bomb is refused here and not expanded later)."""
    stack: list[tuple[Any, int]] = [(raw, 1)]
    nodes = 0
    while stack:
        obj, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ValueError(f"more than {MAX_NODES:,} values (an alias expanding too far?)")
        if depth > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
            stack.extend((k, depth + 1) for k in obj if isinstance(k, (tuple, list, dict)))
        elif isinstance(obj, (list, tuple)):
            stack.extend((v, depth + 1) for v in obj)


_PASSWORD_IN_URL = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"]*:)([^\s@'\"]+)(@)")


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` URL as ``***``."""
    return _PASSWORD_IN_URL.sub(lambda m: m.group(1) + "***" + m.group(3), text)


def _scalar_check(name: str, value: Any, where: str, fail) -> None:
    """What a value must be whatever its parameter: finite, a bounded integer, a scalar."""
    if isinstance(value, float) and not math.isfinite(value):
        fail(where, f"expected a finite number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_KNOB_INT:
        fail(where, f"integer out of range (|value| <= 2**63-1), got {value!r}")
    if isinstance(value, (dict, list)):
        kind = "a mapping" if isinstance(value, dict) else "a list"
        hint = " (axes go under `axes:`)" if isinstance(value, list) else ""
        fail(where, f"expected a single value, got {kind}{hint}")


def _typed_check(name: str, value: Any, where: str, fail) -> None:
    """Booleans are not numbers, and the typed integer columns hold 32 bits."""
    kinds = _FIELD_KINDS.get(name)
    if not kinds:
        return
    if isinstance(value, bool) and bool not in kinds and kinds & {int, float}:
        fail(where, f"expected a number, got {value!r}")
    if int in kinds and isinstance(value, int) and value > MAX_INT_FIELD:
        fail(where, f"must be at most 2**31-1 = {MAX_INT_FIELD}, got {value!r}")


def _base_types(ann: Any) -> set[type]:
    """The plain types inside an annotation (``PositiveInt | None`` -> {int, NoneType})."""
    import typing

    args = typing.get_args(ann)
    if typing.get_origin(ann) is typing.Literal:
        return {type(a) for a in args}
    if not args:
        return {ann} if isinstance(ann, type) else set()
    out: set[type] = set()
    for a in args:
        out |= _base_types(a)
    return out


_FIELD_KINDS = {n: _base_types(f.annotation) for n, f in TrialParams.model_fields.items()}


def _rough_params(params: Mapping[str, Any]) -> int | None:
    """A first bound on a trial's parameter count from its widths alone (None: no usable
    d_model), checked before anything is built, so a d_model of a million is refused in one
    line instead of constructed; :func:`model_params` is the count itself."""
    d = params.get("d_model") or 0
    n = params.get("n_layers") or 0
    if not isinstance(d, int) or not isinstance(n, int) or d <= 0:
        return None
    vocab = params.get("task.vocab_size") or 1000
    vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else 1000
    # ~16 d^2 weights per layer (mixer projections and the MLP) plus the embeddings.
    return max(n, 1) * 16 * d * d + 2 * vocab * d


def _memory_check(params: Mapping[str, Any], where: str, fail, node_memory: int) -> None:
    """Refuse a model whose estimated training memory exceeds the largest node's memory,
    before anything is built (a bad d_model would otherwise allocate terabytes)."""
    n_params = _rough_params(params)
    if n_params is None:
        return
    need = n_params * BYTES_PER_PARAM
    if need > node_memory:
        fail(
            where,
            f"d_model={params.get('d_model')}, n_layers={params.get('n_layers')}: about {_gb(need)} per trial "
            f"({n_params:.3g} parameters x {BYTES_PER_PARAM} bytes), more than the "
            f"largest node's {_gb(node_memory)} of memory",
        )


# What one trial holds on a GPU besides its weights and optimizer state: the process's CUDA
# context and the caching allocator's first blocks (measured: 300-500 MB for torch 2 on
# Pascal to Hopper cards), and the activations the backward pass keeps: per layer about
# ACT_TENSORS tensors of (batch, sequence, d_model) in fp32, plus the logits and their
# gradient. tests/gpu/placement_check.py checks the estimate against a real card's peak.
CUDA_CONTEXT_BYTES = 512 * 2**20
ACT_TENSORS = 48


def _task_shape(params: Mapping[str, Any]) -> tuple[int, int]:
    """(sequence length, vocabulary) of a resolved trial's task, built once per setting."""
    top, _, task_params, _ = split(dict(params))
    return _task_shape_of(str(top.get("task")), tuple(sorted(task_params.items(), key=lambda kv: kv[0])))


_TASK_SHAPES: dict[tuple[str, tuple[tuple[str, Any], ...]], tuple[int, int]] = {}


def _task_shape_of(name: str, task_params: tuple[tuple[str, Any], ...]) -> tuple[int, int]:
    key = (name, task_params)
    if key not in _TASK_SHAPES:
        import tasks

        task = tasks.build(name, **dict(task_params))
        _TASK_SHAPES[key] = (int(task.seq_len), int(task.vocab_size))
    return _TASK_SHAPES[key]


_PARAM_COUNTS: dict[str, int] = {}


def _model_signature(top: Mapping[str, Any], knobs: Mapping[str, Any], task_params: Mapping[str, Any]) -> str:
    return repr(
        (top["arm"], top["d_model"], top["n_layers"], sorted(knobs.items()), top["task"], sorted(task_params.items()))
    )


def _build_count(top: Mapping[str, Any], knobs: Mapping[str, Any], task_params: Mapping[str, Any]) -> int:
    """Build the trial's task and model on torch's meta device (shapes without storage, so a
    65M-parameter model costs nothing to check) and count its parameters; constructor-level
    errors (heads that do not divide the width, a task that cannot be laid out) raise here."""
    import torch

    import cells
    import tasks

    sig = _model_signature(top, knobs, task_params)
    if sig not in _PARAM_COUNTS:
        task = tasks.build(top["task"], **task_params)
        with torch.device("meta"):
            model = cells.build(
                top["arm"], vocab_size=task.vocab_size, d_model=top["d_model"], n_layers=top["n_layers"], **knobs
            )
        _PARAM_COUNTS[sig] = sum(p.numel() for p in model.parameters())
    return _PARAM_COUNTS[sig]


def model_params(params: Mapping[str, Any]) -> int:
    """The parameter count of a resolved trial's model, from the model itself (built once per
    distinct model, on the meta device)."""
    top, knobs, task_params, _ = split(dict(params))
    return _build_count(top, knobs, task_params)


def _activation_bytes(params: Mapping[str, Any]) -> int:
    d = int(params.get("d_model") or 0)
    layers = max(int(params.get("n_layers") or 1), 1)
    batch = int(params.get("batch_size") or 1)
    seq, vocab = _task_shape(params)
    return 4 * batch * seq * (ACT_TENSORS * layers * d + 3 * vocab)


def train_memory_bytes(params: Mapping[str, Any]) -> int:
    """Estimated memory of training one resolved trial, on the host or a GPU alike: weights,
    gradients and two Adam moments of the built model, and the activations of one batch."""
    return model_params(params) * BYTES_PER_PARAM + _activation_bytes(params)


def gpu_memory_bytes(params: Mapping[str, Any], members: int = 1) -> int:
    """Estimated GPU memory of one training process of this resolved trial (``members``: a
    seed pack of that many trials trained as one model): the CUDA context, weights,
    gradients and Adam state of the built model, and the activations of one batch. What
    ``resources: {gpu: auto}`` divides a GPU by."""
    return CUDA_CONTEXT_BYTES + members * train_memory_bytes(params)


# ---- parameter names and values ----------------------------------------------------------

# Each field's type with its constraints (ge, gt, ...), to check one axis value at a time. The
# type is built at run time from the model's fields, so it has no static form (the cast).
_FIELD_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    n: TypeAdapter(cast(Any, Annotated[f.annotation, f])) for n, f in TrialParams.model_fields.items()
}


_ASCII_INT = re.compile(r"\s*[+-]?[0-9]{1,20}\s*", re.ASCII)


def _check_distinct(names: Iterable[str], where: str, fail) -> None:
    """Parameter names must differ by more than case or Unicode normalisation: ``tag.Group``
    and ``tag.group`` (or an NFC and an NFD spelling) look alike everywhere a person reads
    them, and SQL conditions (``--where``) cannot tell them apart."""
    seen: dict[str, str] = {}
    for name in names:
        folded = unicodedata.normalize("NFC", name).casefold()
        if folded in seen and seen[folded] != name:
            fail(where, f"parameters {seen[folded]!r} and {name!r} differ only in case or Unicode form")
        seen.setdefault(folded, name)


def _check_name(name: Any, where: str, fail) -> None:
    if not isinstance(name, str) or not name:
        fail(where, f"parameter names are strings, got {name!r}")
    head, dot, rest = name.partition(".")
    if dot:
        if head not in NAMESPACES or not rest:
            fail(
                where,
                f"unknown parameter {name!r} (dotted names must start with {', '.join(n + '.' for n in NAMESPACES)})",
            )
    elif name not in TOP_LEVEL:
        fail(
            where,
            f"unknown parameter {name!r} (known: {', '.join(TOP_LEVEL)}, or model.<knob>, task.<param>, tag.<label>)",
        )


def _check_value(name: str, value: Any, where: str, fail) -> Any:
    _scalar_check(name, value, where, fail)
    _typed_check(name, value, where, fail)
    if name in _FIELD_ADAPTERS:
        try:
            return _FIELD_ADAPTERS[name].validate_python(value)
        except ValidationError as exc:
            err = exc.errors()[0]
            fail(where, f"{err['msg'].removeprefix('Value error, ')}, got {value!r}")
    if isinstance(value, (dict, list)) and not name.startswith("tag."):
        # knobs are scalars; a list here is almost always an axis written under `fixed`
        if isinstance(value, list):
            fail(where, "expected a single value, got a list (axes go under `axes:`)")
    return value


def _parse_axis(name: str, values: Any, where: str, fail, max_values: int = DEFAULT_MAX_TRIALS) -> list[Any]:
    if isinstance(values, str):
        lo, sep, hi = values.partition("..")
        if not sep:
            fail(where, f"expected a list of values or a range like 0..9, got {values!r}")
        try:
            # ASCII digits only: int() also reads '١' (Arabic-Indic one) and full-width digits.
            if not (_ASCII_INT.fullmatch(lo) and _ASCII_INT.fullmatch(hi)):
                raise ValueError
            lo_i, hi_i = int(lo), int(hi)
        except ValueError:
            fail(where, f"a range must be two integers like 0..9, got {values!r}")
        if hi_i < lo_i:
            fail(where, f"empty range {values!r} (the end is below the start)")
        # Counted before it is materialised: `0..999999999` is a number, not a list.
        if hi_i - lo_i + 1 > max_values:
            fail(
                where,
                f"range {values!r} has {hi_i - lo_i + 1:,} values, above the limit of "
                f"{max_values:,} trials (--max-trials to raise it)",
            )
        values = list(range(lo_i, hi_i + 1))
    if not isinstance(values, list):
        fail(where, f"expected a list of values or a range like 0..9, got {values!r}")
    if not values:
        fail(where, "empty axis (give at least one value)")
    seen: list[Any] = []
    distinct: set[tuple[type, Any]] = set()  # a set: a 100,000-value range is checked in linear time
    for i, v in enumerate(values):
        v = _check_value(name, v, f"{where}[{i}]", fail)
        mark = (type(v), v)
        if mark in distinct:
            fail(f"{where}[{i}]", f"value {v!r} appears twice in the axis")
        distinct.add(mark)
        seen.append(v)
    return seen


# ---- expansion ----------------------------------------------------------------------------


def _expand_block(
    fixed: dict[str, Any],
    axes: dict[str, list[Any]],
    zips: list[list[str]],
    excludes: list[dict[str, Any]],
    where: str,
    fail,
    warnings: list[str] | None = None,
) -> list[dict[str, Any]]:
    zipped: dict[str, list[str]] = {}
    for gi, group in enumerate(zips):
        if len(group) < 2:
            fail(f"{where}zip[{gi}]", "a zip group names at least two axes")
        for name in group:
            if name not in axes:
                fail(f"{where}zip[{gi}]", f"{name!r} is not an axis of this design")
            if name in zipped:
                fail(f"{where}zip[{gi}]", f"axis {name!r} is in two zip groups")
            zipped[name] = group
        lengths = {len(axes[n]) for n in group}
        if len(lengths) > 1:
            fail(
                f"{where}zip[{gi}]",
                "zipped axes must have equal lengths, got " + ", ".join(f"{n}: {len(axes[n])}" for n in group),
            )
    # One factor per free axis or zip group, in declaration order.
    factors: list[list[dict[str, Any]]] = []
    done: set[str] = set()
    for name in axes:
        if name in done:
            continue
        group = zipped.get(name, [name])
        done.update(group)
        factors.append([{n: axes[n][i] for n in group} for i in range(len(axes[name]))])
    for ei, ex in enumerate(excludes):
        if not isinstance(ex, dict) or not ex:
            fail(f"{where}exclude[{ei}]", "expected a mapping of axis: value(s)")
        for k in ex:
            if k not in axes and k not in fixed:
                fail(f"{where}exclude[{ei}].{k}", f"{k!r} is not a parameter of this design")
    out = []
    used = [0] * len(excludes)
    for combo in itertools.product(*factors):
        params = dict(fixed)
        for part in combo:
            params.update(part)
        hit = [i for i, ex in enumerate(excludes) if _matches(params, ex)]
        for i in hit:
            used[i] += 1
        if hit:
            continue
        out.append(params)
    if warnings is not None:
        for ei, n in enumerate(used):
            if n == 0:
                warnings.append(f"{where}exclude[{ei}] {excludes[ei]!r} matches no combination (a misspelt value?)")
    return out


def _design_size(axes: Mapping[str, list[Any]], zips: list[list[str]]) -> int:
    """Combinations of one design, from the axis lengths alone (a zip group counts once),
    before any combination exists."""
    zipped = {n for g in zips if isinstance(g, list) for n in g if n in axes}
    size = math.prod(len(v) for n, v in axes.items() if n not in zipped)
    for g in zips:
        lengths = [len(axes[n]) for n in g if n in axes] if isinstance(g, list) else []
        size *= max(lengths, default=1)
    return size


def _matches(params: Mapping[str, Any], ex: Mapping[str, Any]) -> bool:
    for k, v in ex.items():
        options = v if isinstance(v, list) else [v]
        if params.get(k) not in options:
            return False
    return True


def _validate_trial(params: dict[str, Any], where: str, fail, built: set[str]) -> dict[str, Any]:
    import cells
    import tasks

    try:
        resolved = resolve(params)
    except ValidationError as exc:
        loc, msg = _first_error(exc)
        fail(where, f"{loc}: {msg}")
    top, knobs, task_params, _ = split(resolved)
    try:
        tasks.validate(top["task"], task_params)
    except ValueError as exc:
        fail(where, str(exc))
    try:
        cells.validate(top["arm"], knobs, d_model=top["d_model"], n_layers=top["n_layers"])
    except ValueError as exc:
        fail(where, str(exc))
    # Build each distinct model and task once (on the meta device): constructor-level errors
    # fail here, not in trial 417, and the model's own parameter count bounds its memory.
    sig = _model_signature(top, knobs, task_params)
    if sig not in built:
        built.add(sig)
        try:
            _build_count(top, knobs, task_params)
        except (ValueError, TypeError, AssertionError) as exc:
            fail(where, f"cannot build {top['arm']!r} on {top['task']!r}: {exc}")
    return resolved


def _match(
    params: dict[str, Any], mp: MatchParams, where: str, fail, matched: dict[tuple, dict[str, Any]]
) -> dict[str, Any]:
    """Set ``model.mlp_hidden`` so this trial's model has ``mp.target`` parameters (a toggled
    arm: its base's width, see ``MatchParams.toggles``)."""
    import tasks

    from orchestrator.design.matching import LEVER, solve, toggled, unmatched

    try:
        top, knobs, task_params, _ = split(resolve(params))
    except ValidationError as exc:
        loc, msg = _first_error(exc)
        fail(where, f"{loc}: {msg}")
    try:
        vocab = tasks.build(top["task"], **task_params).vocab_size
        shape = (vocab, top["d_model"], top["n_layers"], tuple(sorted(knobs.items())))
        if top["arm"] in mp.toggles:
            row = toggled(top["arm"], mp.toggles[top["arm"]], mp.root(top["arm"]), *shape, mp.target, mp.tolerance)
        elif mp.arms is not None and top["arm"] not in mp.arms:
            row = unmatched(top["arm"], *shape)
            sig = (row["arm"], row["d_model"], row["n_layers"], vocab, tuple(sorted(knobs.items())))
            matched.setdefault(sig, {**row, "knobs": dict(knobs)})
            return params
        else:
            row = solve(top["arm"], *shape, mp.target, mp.tolerance)
    except (ValueError, TypeError) as exc:
        fail(f"match_params ({where})", str(exc))
    sig = (row["arm"], row["d_model"], row["n_layers"], vocab, tuple(sorted(knobs.items())))
    matched.setdefault(sig, {**row, "knobs": dict(knobs)})
    return {**params, f"model.{LEVER}": row[LEVER]}


# ---- loading, step by step ----------------------------------------------------------------

Fail = Callable[[str, str], NoReturn]


@dataclass
class _Design:
    """One design to expand: the spec's top level, or one of its blocks over it."""

    pre: str  # the prefix of its error locations: "" or "blocks[i]."
    fixed: dict[str, Any]
    axes: dict[str, list[Any]]
    zips: list[list[str]]
    excludes: list[dict[str, Any]]


@dataclass
class _Trials:
    """What expanding the designs gives: the trials in order and what was learnt on the way."""

    trials: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    axes: dict[str, list[Any]] = field(default_factory=dict)  # every axis's values over all designs
    matched: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _failer(label: str) -> Fail:
    """The ``fail(where, msg)`` every check calls: a SpecError ``LABEL: WHERE: MSG``."""

    def fail(where: str, msg: str) -> NoReturn:
        raise SpecError(f"{label}: {where}: {msg}")

    return fail


def _read_source(path: str | Path | None, text: str | None, label: str) -> str:
    """The spec's text: as given, or read from ``path``; bounded in size, no NUL byte."""
    if text is None:
        if path is None:
            raise SpecError("<spec>: give a path or the spec's text")
        try:
            # A regular file only, its size checked before reading (a symlink to /dev/zero or
            # a FIFO would otherwise fill memory or hang).
            text = read_text_file(path, limit=MAX_SPEC_BYTES, label=label)
        except UserError as exc:
            raise SpecError(str(exc)) from None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(f"{label}: above the {MAX_SPEC_BYTES:,}-byte (1 MiB) limit of a spec")
    if "\x00" in text:
        raise SpecError(f"{label}: contains a NUL byte (not a text file?)")
    return text


def _parse_yaml(text: str, label: str) -> Any:
    """The YAML, strictly (no duplicate keys, no tags), bounded in depth and size."""
    try:
        raw = load_strict(text)
        _shape(raw)
    except RecursionError:
        raise SpecError(f"{label}: nested too deeply (more than {MAX_DEPTH} levels)") from None
    except ValueError as exc:
        raise SpecError(f"{label}: {exc}") from None
    except DuplicateKeyError as exc:
        line = exc.mark.line + 1 if exc.mark else "?"
        raise SpecError(f"{label}: line {line}: duplicate key {exc.key!r}") from None
    except TagError as exc:
        line = exc.mark.line + 1 if exc.mark else "?"
        raise SpecError(
            f"{label}: line {line}: YAML tag {exc.shown!r} is not allowed "
            "(a spec is plain values, lists and mappings; quote a value to make it a string)"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{label}: malformed YAML at {pos}: {problem}") from None
    return raw


def _validate_shape(raw: Any, label: str, fail: Fail) -> SweepSpec:
    """The top level: a mapping of the known keys with values of the right kinds."""
    if not isinstance(raw, dict):
        raise SpecError(f"{label}: (top level): expected a mapping with name, axes, fixed, ...")
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as exc:
        where, msg = _first_error(exc)
        fail(where, msg)


def _import_plugins(spec: SweepSpec, label: str) -> None:
    """The modules the spec's ``plugins:`` names, imported before its arms and tasks are checked."""
    from orchestrator import plugins

    plugins.ensure(spec.plugins, f"{label}: plugins")


def _base_design(
    spec: SweepSpec, raw: dict[str, Any], fail: Fail, max_trials: int
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The top level's fixed parameters (the budget's among them) and its axes, ranges expanded."""
    base_fixed = {k: v for k, v in spec.budget.model_dump().items() if v is not None}
    for name, value in raw.get("budget", {}).items() if isinstance(raw.get("budget"), dict) else ():
        # the budget model coerces (true -> 1): check what was written
        _check_value(name, value, f"budget.{name}", fail)
    for name, value in spec.fixed.items():
        _check_name(name, f"fixed.{name}", fail)
        base_fixed[name] = _check_value(name, value, f"fixed.{name}", fail)
    base_axes: dict[str, list[Any]] = {}
    for name, values in spec.axes.items():
        _check_name(name, f"axes.{name}", fail)
        if name in spec.fixed:
            fail(f"axes.{name}", f"duplicate axis: {name!r} is also under fixed")
        base_axes[name] = _parse_axis(name, values, f"axes.{name}", fail, max_trials)
    _check_distinct([*base_fixed, *base_axes], "fixed/axes", fail)
    return base_fixed, base_axes


def _designs(spec: SweepSpec, raw: dict[str, Any], fail: Fail, max_trials: int) -> list[_Design]:
    """The designs to expand: the top level alone, or each block over it."""
    base_fixed, base_axes = _base_design(spec, raw, fail, max_trials)
    if not spec.blocks:
        return [_Design("", base_fixed, base_axes, spec.zip, spec.exclude)]
    designs = []
    for bi, block in enumerate(spec.blocks):
        pre = f"blocks[{bi}]."
        fixed = dict(base_fixed)
        axes = dict(base_axes)
        for name, value in block.fixed.items():
            _check_name(name, f"{pre}fixed.{name}", fail)
            if name in block.axes:
                fail(f"{pre}axes.{name}", f"duplicate axis: {name!r} is also under fixed")
            axes.pop(name, None)
            fixed[name] = _check_value(name, value, f"{pre}fixed.{name}", fail)
        for name, values in block.axes.items():
            _check_name(name, f"{pre}axes.{name}", fail)
            fixed.pop(name, None)
            axes[name] = _parse_axis(name, values, f"{pre}axes.{name}", fail, max_trials)
        _check_distinct([*fixed, *axes], f"{pre}fixed/axes", fail)
        designs.append(_Design(pre, fixed, axes, spec.zip + block.zip, spec.exclude + block.exclude))
    return designs


def _check_design_size(spec: SweepSpec, designs: list[_Design], fail: Fail, max_trials: int) -> None:
    """The combinations, counted from the axis sizes before any exists, within ``max_trials``."""
    total = sum(_design_size(d.axes, d.zips) for d in designs)
    if total > max_trials:
        fail(
            "axes" if not spec.blocks else "blocks",
            f"the design has {total:,} combinations (before exclude), above the limit of "
            f"{max_trials:,} trials (--max-trials to raise it)",
        )


def _trial(
    params: dict[str, Any],
    spec: SweepSpec,
    where: str,
    fail: Fail,
    memory: int,
    built: set[str],
    matched: dict[tuple, dict[str, Any]],
) -> dict[str, Any]:
    """One combination as a resolved trial: sized by ``match_params``, its memory bounded, its
    model and task built once, evaluated at least once."""
    if spec.match_params is not None:
        params = _match(params, spec.match_params, where, fail, matched)
    _memory_check(params, where, fail, memory)
    resolved = _validate_trial(params, where, fail, built)
    if resolved.get("eval_every", 0) > resolved.get("steps", 0):
        fail(
            where,
            f"eval_every ({resolved['eval_every']}) is above steps "
            f"({resolved['steps']}): the trial would never be evaluated",
        )
    _size_check(resolved, where, fail, memory)
    return resolved


def _size_check(resolved: Mapping[str, Any], where: str, fail: Fail, node_memory: int) -> None:
    """The built model's training memory against the largest node, a batch no study comes
    near, and the eval rows one trial would store."""
    batch = int(resolved["batch_size"])
    if batch > MAX_BATCH_SIZE:
        fail(where, f"batch_size {batch:,} is above {MAX_BATCH_SIZE:,} (far past any study's batch)")
    rows = int(resolved["steps"]) // int(resolved["eval_every"]) + 2
    if rows > MAX_EVALS_PER_TRIAL:
        fail(
            where,
            f"steps {resolved['steps']:,} / eval_every {resolved['eval_every']:,} stores about {rows:,} eval rows "
            f"per trial, above {MAX_EVALS_PER_TRIAL:,}: evaluate less often",
        )
    n_params = model_params(resolved)
    need = train_memory_bytes(resolved)
    if need > node_memory:
        fail(
            where,
            f"{resolved['arm']} with these settings has {n_params:,} parameters: about {_gb(need)} to train "
            f"(weights, gradients and Adam state x {BYTES_PER_PARAM} bytes, plus one batch's activations), "
            f"more than the largest node's {_gb(node_memory)} of memory",
        )


def _add_once(
    out: list[tuple[str, dict[str, Any]]],
    seen: dict[str, dict[str, Any]],
    resolved: dict[str, Any],
    where: str,
    fail: Fail,
) -> None:
    """Append the trial under its key unless the same trial is there; refuse two trials that
    differ only in what leaves their identity unchanged."""
    key = trial_key(resolved)
    if key not in seen:
        seen[key] = resolved
        out.append((key, resolved))
    elif seen[key] != resolved:
        other = seen[key]
        fields = sorted(n for n in set(resolved) | set(other) if resolved.get(n) != other.get(n))
        fail(
            where,
            f"this trial differs from another only in {', '.join(fields)}, which leave a trial's "
            "identity unchanged (budget, execution settings, tag.* labels): they are one trial; "
            "vary what it trains or keep one",
        )


def _expand(spec: SweepSpec, designs: list[_Design], fail: Fail, memory: int) -> _Trials:
    """Every design's combinations, exclude applied, as validated trials in a stable order."""
    out = _Trials()
    seen: dict[str, dict[str, Any]] = {}
    built: set[str] = set()
    matched: dict[tuple, dict[str, Any]] = {}
    for d in designs:
        for name in ("arm", "task"):
            if name not in d.fixed and name not in d.axes:
                fail(f"{d.pre}fixed" if d.pre else "fixed", f"{name!r} is required (in fixed or axes)")
        for name, values in d.axes.items():
            union = out.axes.setdefault(name, [])
            union.extend(v for v in values if v not in union)
        for params in _expand_block(d.fixed, d.axes, d.zips, d.excludes, d.pre, fail, out.warnings):
            where = f"{d.pre}axes ({', '.join(f'{k}={params[k]!r}' for k in d.axes)})" if d.axes else f"{d.pre}fixed"
            _add_once(out.trials, seen, _trial(params, spec, where, fail, memory, built, matched), where, fail)
    if not out.trials:
        fail("exclude", "the design has no trials left (every combination is excluded)")
    out.matched = list(matched.values())
    return out


def _sequential(spec: SweepSpec, axes: dict[str, list[Any]], label: str) -> Any:
    """The ``sequential:`` block checked against the axes (None without one)."""
    if spec.sequential is None:
        return None
    from orchestrator.design.sequential import validate_sequential

    try:
        return validate_sequential(spec.sequential, axes)
    except UserError as exc:
        raise SpecError(f"{label}: {exc}") from None


def _check_stop(spec: SweepSpec, acfg: AnalysisConfig, fail: Fail) -> None:
    """A stop rule needs lone trials (not seed packs); a sequential Fisher design decides on
    lock-in at budget, which a stopped trial does not have unless the analysis imputes it."""
    if spec.stop is None:
        return
    if spec.pack_seeds != 1:
        fail(
            "stop", "needs pack_seeds: 1 (a seed pack trains its members in lockstep, so one member cannot stop alone)"
        )
    seq = spec.sequential if isinstance(spec.sequential, dict) else {}
    if seq.get("test") == "fisher" and acfg.stopped_as is None:
        fail(
            "stop",
            "a sequential fisher design tests lock-in at budget, which a trial the stop rule ended "
            "does not have: set analysis.stopped_as: solved (the analysis's own imputation), use "
            "test: logrank, or drop stop",
        )


def _resolve_analysis(spec: SweepSpec, label: str) -> AnalysisConfig:
    """The spec's analysis block, validated (one line naming the field); the stop rule's
    ``escape_at`` defaults to the block's."""
    try:
        acfg = parse_config(spec.analysis, source=f"{label}: analysis")
    except UserError as exc:
        raise SpecError(str(exc)) from None
    if spec.stop is not None and spec.stop.escape_at is None:
        # The trial decides from its own trace, so the threshold travels with the spec.
        spec.stop.escape_at = acfg.escape_at
    return acfg


def _stored_text(text: str, warnings: list[str]) -> str:
    """The text stored with the sweep: a password in a URL never reaches the database."""
    stored = redact(text)
    if stored != text:
        warnings.append(
            "the spec holds a password in a URL; it is stored as *** — put it in "
            "PGPASSFILE (~/.pgpass) or the environment (PGPASSWORD, $ORCH_DB) instead"
        )
    return stored


def load(
    path: str | Path | None = None,
    *,
    text: str | None = None,
    max_trials: int = DEFAULT_MAX_TRIALS,
    node_memory: int | None = None,
) -> Sweep:
    """Read, validate and expand a spec. Raises SpecError (a one-line UserError).

    ``max_trials`` caps the design (counted from the axis sizes before anything is
    expanded); ``node_memory`` (bytes, default this machine's) bounds a trial's model."""
    label = str(path) if path is not None else "<spec>"
    fail = _failer(label)
    text = _read_source(path, text, label)
    raw = _parse_yaml(text, label)
    spec = _validate_shape(raw, label, fail)
    _import_plugins(spec, label)
    designs = _designs(spec, raw, fail, max_trials)
    _check_design_size(spec, designs, fail, max_trials)
    memory = node_memory if node_memory is not None else _node_memory_bytes()
    expanded = _expand(spec, designs, fail, memory)
    sequential = _sequential(spec, expanded.axes, label)
    analysis = _resolve_analysis(spec, label)
    _check_stop(spec, analysis, fail)
    stored = _stored_text(text, expanded.warnings)
    path = Path(path) if path is not None else None
    # the expansion's trials, axes, matched models and warnings are the Sweep's fields of those names
    return Sweep(spec=spec, path=path, text=stored, sequential=sequential, analysis=analysis, **vars(expanded))
