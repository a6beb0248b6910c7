"""From a validated spec to its trials: every parameter name and value checked, axes and ranges
parsed, each design (the top level or a block over it) crossed with zip and exclude applied,
sized by ``match_params``, each distinct model built once, and every trial keyed once."""

from __future__ import annotations

import itertools
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, cast

from pydantic import (
    TypeAdapter,
    ValidationError,
)

from orchestrator.analysis_config import AnalysisConfig, parse_config
from orchestrator.design.matching import MatchParams
from orchestrator.errors import UserError
from orchestrator.keys import trial_key
from orchestrator.params import NAMESPACES, TOP_LEVEL, TrialParams, resolve, split
from orchestrator.spec.resources import build_count, memory_check, model_signature, size_check
from orchestrator.spec.schema import Fail, SpecError, SweepSpec, first_error

DEFAULT_MAX_TRIALS = 100_000


# Typed columns of the store (trials.seed, steps, eval_every, batch_size, ...) are 32-bit
# INTEGER on PostgreSQL: a larger value would pass here and fail at the first write.
MAX_INT_FIELD = 2**31 - 1
MAX_KNOB_INT = 2**63 - 1  # anything in params is stored as JSON and a DOUBLE in trial_params


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
        loc, msg = first_error(exc)
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
    sig = model_signature(top, knobs, task_params)
    if sig not in built:
        built.add(sig)
        try:
            build_count(top, knobs, task_params)
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
        loc, msg = first_error(exc)
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


def split_designs(spec: SweepSpec, raw: dict[str, Any], fail: Fail, max_trials: int) -> list[_Design]:
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


def check_design_size(spec: SweepSpec, designs: list[_Design], fail: Fail, max_trials: int) -> None:
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
    memory_check(params, where, fail, memory)
    resolved = _validate_trial(params, where, fail, built)
    if resolved.get("eval_every", 0) > resolved.get("steps", 0):
        fail(
            where,
            f"eval_every ({resolved['eval_every']}) is above steps "
            f"({resolved['steps']}): the trial would never be evaluated",
        )
    size_check(resolved, where, fail, memory)
    return resolved


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


def expand_trials(spec: SweepSpec, designs: list[_Design], fail: Fail, memory: int) -> _Trials:
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


def check_sequential(spec: SweepSpec, axes: dict[str, list[Any]], label: str) -> Any:
    """The ``sequential:`` block checked against the axes (None without one)."""
    if spec.sequential is None:
        return None
    from orchestrator.design.sequential import validate_sequential

    try:
        return validate_sequential(spec.sequential, axes)
    except UserError as exc:
        raise SpecError(f"{label}: {exc}") from None


def check_stop(spec: SweepSpec, acfg: AnalysisConfig, fail: Fail) -> None:
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


def resolve_analysis(spec: SweepSpec, label: str) -> AnalysisConfig:
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
