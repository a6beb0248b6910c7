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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, PositiveInt, TypeAdapter, ValidationError,
                      field_validator, model_validator)

from orchestrator.design.matching import MatchParams
from orchestrator.errors import UserError
from orchestrator.keys import spec_hash, trial_key
from orchestrator.params import NAMESPACES, TOP_LEVEL, TrialParams, resolve, split
from orchestrator.yaml_load import DuplicateKeyError, load_strict


class SpecError(UserError):
    """A spec that cannot run; the message is ``FILE: KEY.PATH: what was expected``."""


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu: float = Field(1.0, gt=0, description="CPUs per trial (also torch threads, rounded down)")
    gpu: float = Field(0.0, ge=0, description="GPU fraction per trial; 0.25 = four share a GPU")

    @field_validator("gpu")
    @classmethod
    def _whole_above_one(cls, v: float) -> float:
        if v > 1 and v != int(v):
            raise ValueError("a GPU fraction above 1 must be a whole number of GPUs")
        return v


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
    escape_at: float | None = Field(None, gt=0, le=1, description="accuracy that counts as escaped; "
                                    "default: the analysis block's escape_at")


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
    retries: int = Field(0, ge=0)
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

    @model_validator(mode="after")
    def _analysis(self) -> SweepSpec:
        if self.analysis is not None:
            # Imported here: the analysis package loads pandas and the statistics, which
            # every CLI start and the runner import this module without needing.
            from orchestrator.analysis.config import AnalysisConfig

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
    # The analysis block's event thresholds, resolved here so the runner (which never imports
    # the analysis) tests looks with the same definitions the analysis reports.
    thresholds: dict[str, Any] = field(default_factory=dict)

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
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required key is missing"
    if "input" in err and err["type"] not in ("extra_forbidden", "missing"):
        msg += f", got {err['input']!r}"
    return where, msg


# ---- parameter names and values ----------------------------------------------------------

# Each field's type with its constraints (ge, gt, ...), to check one axis value at a time.
_FIELD_ADAPTERS = {n: TypeAdapter(Annotated[f.annotation, f])
                   for n, f in TrialParams.model_fields.items()}


def _check_name(name: Any, where: str, fail) -> None:
    if not isinstance(name, str) or not name:
        fail(where, f"parameter names are strings, got {name!r}")
    head, dot, rest = name.partition(".")
    if dot:
        if head not in NAMESPACES or not rest:
            fail(where, f"unknown parameter {name!r} (dotted names must start with "
                        f"{', '.join(n + '.' for n in NAMESPACES)})")
    elif name not in TOP_LEVEL:
        fail(where, f"unknown parameter {name!r} (known: {', '.join(TOP_LEVEL)}, "
                    "or model.<knob>, task.<param>, tag.<label>)")


def _check_value(name: str, value: Any, where: str, fail) -> Any:
    if name in _FIELD_ADAPTERS:
        try:
            return _FIELD_ADAPTERS[name].validate_python(value)
        except ValidationError as exc:
            err = exc.errors()[0]
            fail(where, f"{err['msg']}, got {value!r}")
    if isinstance(value, (dict, list)) and not name.startswith("tag."):
        # knobs are scalars; a list here is almost always an axis written under `fixed`
        if isinstance(value, list):
            fail(where, "expected a single value, got a list (axes go under `axes:`)")
    return value


def _parse_axis(name: str, values: Any, where: str, fail) -> list[Any]:
    if isinstance(values, str):
        lo, sep, hi = values.partition("..")
        if not sep:
            fail(where, f"expected a list of values or a range like 0..9, got {values!r}")
        try:
            lo_i, hi_i = int(lo), int(hi)
        except ValueError:
            fail(where, f"a range must be two integers like 0..9, got {values!r}")
        if hi_i < lo_i:
            fail(where, f"empty range {values!r} (the end is below the start)")
        values = list(range(lo_i, hi_i + 1))
    if not isinstance(values, list):
        fail(where, f"expected a list of values or a range like 0..9, got {values!r}")
    if not values:
        fail(where, "empty axis (give at least one value)")
    seen: list[Any] = []
    for i, v in enumerate(values):
        v = _check_value(name, v, f"{where}[{i}]", fail)
        if any(v == s and type(v) is type(s) for s in seen):
            fail(f"{where}[{i}]", f"value {v!r} appears twice in the axis")
        seen.append(v)
    return seen


# ---- expansion ----------------------------------------------------------------------------

def _expand_block(fixed: dict[str, Any], axes: dict[str, list[Any]], zips: list[list[str]],
                  excludes: list[dict[str, Any]], where: str, fail) -> list[dict[str, Any]]:
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
            fail(f"{where}zip[{gi}]", "zipped axes must have equal lengths, got "
                 + ", ".join(f"{n}: {len(axes[n])}" for n in group))
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
    for combo in itertools.product(*factors):
        params = dict(fixed)
        for part in combo:
            params.update(part)
        if any(_matches(params, ex) for ex in excludes):
            continue
        out.append(params)
    return out


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
    # Build each distinct model and task once on the CPU: constructor-level errors (heads that
    # do not divide the width, a task that cannot be laid out) fail here, not in trial 417.
    sig = repr((top["arm"], top["d_model"], top["n_layers"], sorted(knobs.items()),
                top["task"], sorted(task_params.items())))
    if sig not in built:
        built.add(sig)
        try:
            task = tasks.build(top["task"], **task_params)
            cells.build(top["arm"], vocab_size=task.vocab_size, d_model=top["d_model"],
                        n_layers=top["n_layers"], **knobs)
        except (ValueError, TypeError, AssertionError) as exc:
            fail(where, f"cannot build {top['arm']!r} on {top['task']!r}: {exc}")
    return resolved


def _match(params: dict[str, Any], mp: MatchParams, where: str, fail,
           matched: dict[tuple, dict[str, Any]]) -> dict[str, Any]:
    """Set ``model.mlp_hidden`` so this trial's model has ``mp.target`` parameters."""
    import tasks

    from orchestrator.design.matching import LEVER, solve, unmatched

    try:
        top, knobs, task_params, _ = split(resolve(params))
    except ValidationError as exc:
        loc, msg = _first_error(exc)
        fail(where, f"{loc}: {msg}")
    try:
        vocab = tasks.build(top["task"], **task_params).vocab_size
        if mp.arms is not None and top["arm"] not in mp.arms:
            row = unmatched(top["arm"], vocab, top["d_model"], top["n_layers"],
                            tuple(sorted(knobs.items())))
            sig = (row["arm"], row["d_model"], row["n_layers"], vocab, tuple(sorted(knobs.items())))
            matched.setdefault(sig, {**row, "knobs": dict(knobs)})
            return params
        row = solve(top["arm"], vocab, top["d_model"], top["n_layers"],
                    tuple(sorted(knobs.items())), mp.target, mp.tolerance)
    except (ValueError, TypeError) as exc:
        fail(f"match_params ({where})", str(exc))
    sig = (row["arm"], row["d_model"], row["n_layers"], vocab, tuple(sorted(knobs.items())))
    matched.setdefault(sig, {**row, "knobs": dict(knobs)})
    return {**params, f"model.{LEVER}": row[LEVER]}


def load(path: str | Path | None = None, *, text: str | None = None) -> Sweep:
    """Read, validate and expand a spec. Raises SpecError (a one-line UserError)."""
    label = str(path) if path is not None else "<spec>"

    def fail(where: str, msg: str):
        raise SpecError(f"{label}: {where}: {msg}")

    if text is None:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise SpecError(f"{label}: no such file") from None
        except OSError as exc:
            raise SpecError(f"{label}: cannot read: {exc.strerror}") from None
    try:
        raw = load_strict(text)
    except DuplicateKeyError as exc:
        line = exc.mark.line + 1 if exc.mark else "?"
        raise SpecError(f"{label}: line {line}: duplicate key {exc.key!r}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{label}: malformed YAML at {pos}: {problem}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{label}: (top level): expected a mapping with name, axes, fixed, ...")
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        where, msg = _first_error(exc)
        fail(where, msg)

    from orchestrator import plugins

    plugins.ensure(spec.plugins, f"{label}: plugins")
    base_fixed = {k: v for k, v in spec.budget.model_dump().items() if v is not None}
    for name, value in spec.fixed.items():
        _check_name(name, f"fixed.{name}", fail)
        base_fixed[name] = _check_value(name, value, f"fixed.{name}", fail)
    base_axes: dict[str, list[Any]] = {}
    for name, values in spec.axes.items():
        _check_name(name, f"axes.{name}", fail)
        if name in spec.fixed:
            fail(f"axes.{name}", f"duplicate axis: {name!r} is also under fixed")
        base_axes[name] = _parse_axis(name, values, f"axes.{name}", fail)

    designs: list[tuple[str, dict, dict, list, list]] = []
    if not spec.blocks:
        designs.append(("", base_fixed, base_axes, spec.zip, spec.exclude))
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
            axes[name] = _parse_axis(name, values, f"{pre}axes.{name}", fail)
        designs.append((pre, fixed, axes, spec.zip + block.zip, spec.exclude + block.exclude))

    trials: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    axes_union: dict[str, list[Any]] = {}
    built: set[str] = set()
    matched: dict[tuple, dict[str, Any]] = {}
    for pre, fixed, axes, zips, excludes in designs:
        for name in ("arm", "task"):
            if name not in fixed and name not in axes:
                fail(f"{pre}fixed" if pre else "fixed", f"{name!r} is required (in fixed or axes)")
        for name, values in axes.items():
            union = axes_union.setdefault(name, [])
            union.extend(v for v in values if v not in union)
        for params in _expand_block(fixed, axes, zips, excludes, pre, fail):
            where = (f"{pre}axes ({', '.join(f'{k}={params[k]!r}' for k in axes)})"
                     if axes else f"{pre}fixed")
            if spec.match_params is not None:
                params = _match(params, spec.match_params, where, fail, matched)
            resolved = _validate_trial(params, where, fail, built)
            key = trial_key(resolved)
            if key not in seen:
                seen.add(key)
                trials.append((key, resolved))
    if not trials:
        fail("exclude", "the design has no trials left (every combination is excluded)")
    sequential = None
    if spec.sequential is not None:
        from orchestrator.design.sequential import validate_sequential

        try:
            sequential = validate_sequential(spec.sequential, axes_union)
        except UserError as exc:
            raise SpecError(f"{label}: {exc}") from None
    if spec.stop is not None and spec.pack_seeds != 1:
        fail("stop", "needs pack_seeds: 1 (a seed pack trains its members in lockstep, so one "
                     "member cannot stop alone)")
    thresholds: dict[str, Any] = {}
    if spec.sequential is not None or spec.stop is not None:
        # Imported only here: the analysis package loads pandas and the statistics.
        from orchestrator.analysis.config import AnalysisConfig

        acfg = AnalysisConfig.model_validate(spec.analysis or {})
        thresholds = {"lockin": acfg.lockin, "escape_at": acfg.escape_at, "metric": acfg.metric,
                      "horizon": acfg.horizon}
        if spec.stop is not None and spec.stop.escape_at is None:
            # The trial decides from its own trace, so the threshold travels with the spec.
            spec.stop.escape_at = acfg.escape_at
    return Sweep(spec=spec, path=Path(path) if path is not None else None, text=text,
                 trials=trials, axes=axes_union, matched=list(matched.values()),
                 sequential=sequential, thresholds=thresholds)
