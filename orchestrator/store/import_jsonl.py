"""``orchestrator import``: traces produced elsewhere become trials of a sweep.

One JSON object per line::

    {"params": {"arm": "mlstm", "seed": 3, "lr": 0.003, ...},
     "trace": [{"step": 1, "acc": 0.01, "loss": 4.5}, {"step": 200, "acc": 0.03}, ...],
     "status": "completed"}

``params`` may be nested (it is flattened to dotted names, as the store keeps them);
``status`` (completed, diverged or failed; default completed) and ``error`` (text) are
optional. Each trace point needs an int ``step`` and an ``acc`` in [0, 1]; ``loss``,
``train_loss``, ``lr``, ``elapsed_s`` and any other number of the eval point
(``orchestrator/evals.py``, under its own name) fill their columns and any other key goes
into the row's ``metrics``. Numbers are JSON numbers (a string or a boolean is not one); ``NaN``,
``Infinity``, ``-Infinity`` (as Python's json writes them) and a literal that overflows
(``1e400``, read as the infinity it is) are accepted in ``acc``/``loss``/``train_loss`` and
in metrics, and ``null`` in ``acc`` (no result) or a loss (not recorded): a run whose trace
goes non-finite (a NaN/inf loss, a NaN/inf/null acc) is stored as ``diverged``, as the
training loop stores its own. Every point is stored: a non-finite value is stored as NULL
and named in the row's ``nonfinite`` column (see ``repo.upsert_evals``), so a point with a
finite accuracy and a NaN loss keeps its accuracy. Integers beyond 64 bits are refused.

Refused, each in one line, before anything is written: a source that is not a regular file
or is larger than :data:`MAX_IMPORT_BYTES`; text that is not UTF-8, a string (key or value)
with a lone surrogate escape (``"\\udc80"``) or a NUL (``"\\u0000"``, which PostgreSQL
text cannot hold); a JSON object with the same key twice; parameter names that are empty or
have an empty dotted part (``""``, ``"task."``, ``".K"``), that hold control characters, or
that collide once nested objects are flattened (``{"task.K": 8, "task": {"K": 16}}``);
values of the store's typed parameter columns (``seed``, ``lr``, ``arm``, ...) that are not
of the column's type (``"seed": true``); trial parameters outside the bounds a spec holds
them to (``params.TrialParams``: ``"seed": -5``, ``"lr": 9.2e18``). Imports never write into a
sweep that ``submit`` created (its trials are real runs): the sweep's stored ``origin``
says who made it, whatever its spec text; the sweep name follows the rule of spec names.
Every line is validated before anything is written, and the whole file is written in one
transaction: a malformed file imports nothing. Re-importing a file is idempotent (trial
keys come from the parameters, eval rows are upserts).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import stat
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictStr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import Engine

from orchestrator.errors import UserError
from orchestrator import evals
from orchestrator.evals import NUMBERS
from orchestrator.keys import record_key
from orchestrator.status import Status

MAX_REPORTED = 5
# The same rule as spec names (the ``name`` pattern of ``spec/schema.py``, which pydantic matches against the
# whole string): a sweep name becomes a folder name (reports, checkpoints). Used with
# ``fullmatch``: ``re.match`` with ``$`` also accepts the name followed by a newline.
SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}")
# A published study's traces are a few MB; the whole file is parsed in memory.
MAX_IMPORT_BYTES = 256 * 2**20
IMPORTED_PREFIX = "# imported from "
MAX_INT = 2**63 - 1
MAX_STEP = 2**31 - 1  # evals.step is a 32-bit INTEGER on PostgreSQL
MAX_PARAM_DEPTH = 8


# A trace point's input key for each of the eval point's numbers (the file format says ``lr``
# for what the store calls ``step_lr``, the learning rate the step ran at) and which of them
# must be finite or make a run diverged: orchestrator/evals.py. ``acc`` is the one required.
INPUT_NAMES = dict(evals.INPUT_NAMES)
_OPTIONAL = tuple(INPUT_NAMES[n] for n in NUMBERS if n != "acc")
_FINITE = tuple(INPUT_NAMES[n] for n in evals.FINITE_ON_IMPORT)
_DIVERGING = tuple(INPUT_NAMES[n] for n in evals.DIVERGING if n != "acc")


class _TracePointChecks(BaseModel):
    """A trace point's step, accuracy and the checks of every number; :data:`TracePoint`
    adds a field per other number of the eval point (each optional)."""

    model_config = ConfigDict(extra="allow")

    step: int = Field(ge=0, le=MAX_STEP)
    # None / NaN / +-inf mark a diverged run (see ImportRecord); a finite acc is in [0, 1].
    acc: StrictFloat | None

    @field_validator("step", mode="before")
    @classmethod
    def _integral(cls, v: Any) -> Any:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()) or isinstance(v, str):
            raise ValueError("step must be an integer")
        return v

    @field_validator("acc", *_OPTIONAL, mode="before", check_fields=False)
    @classmethod
    def _not_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError(f"expected a number, got {_show(v)} (a boolean is not a number)")
        return v

    @field_validator("acc")
    @classmethod
    def _unit(cls, v: float | None) -> float | None:
        if v is not None and math.isfinite(v) and not 0.0 <= v <= 1.0:
            raise ValueError(f"acc must be in [0, 1], got {v!r}")
        return v

    @field_validator(*_FINITE, check_fields=False)
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"expected a finite number, got {v!r}")
        return v

    @property
    def finite(self) -> bool:
        """Whether the run was still finite here: acc a number, no NaN/inf loss (a null loss
        is a loss that was not recorded; a null acc is a point without a result)."""
        if self.acc is None or not math.isfinite(self.acc):
            return False
        return all(v is None or math.isfinite(v) for v in (getattr(self, n) for n in _DIVERGING))


if TYPE_CHECKING:
    TracePoint = _TracePointChecks
else:
    TracePoint = create_model(
        "TracePoint",
        __base__=_TracePointChecks,
        __module__=__name__,
        **{n: (StrictFloat | None, None) for n in _OPTIONAL},
    )


def _show(v: Any, limit: int = 40) -> str:
    """A value as JSON would spell it (``true``, ``"x"``), escaped to ASCII, one line, short."""
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(path: tuple[Any, ...]) -> str:
    """``params.task.K``, ``trace[3].acc``; a key that is not a plain name is quoted."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if re.fullmatch(r"[A-Za-z0-9_.\-]{1,60}", part) else _show(part)
            out += f".{name}" if out else name
    return out or "the record"


def _check_string(s: str, path: tuple[Any, ...], what: str) -> None:
    if "\x00" in s:
        raise ValueError(f"{_where(path)}: {what} contains a NUL character (\\u0000), which the store cannot hold")
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = s[exc.start]
            raise ValueError(
                f"{_where(path)}: {what} is not valid Unicode (a lone surrogate \\u{ord(bad):04x})"
            ) from None


def check_text(obj: Any) -> None:
    """Every string of a parsed record, key or value, is text the store can hold: valid
    Unicode (JSON's ``\\udc80`` escapes a lone surrogate, which no UTF-8 encoder accepts)
    without NUL (PostgreSQL text cannot hold one). Raises ValueError naming where."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(obj, ())]
    while stack:
        o, path = stack.pop()
        if isinstance(o, str):
            _check_string(o, path, "a string")
        elif isinstance(o, dict):
            for k, v in o.items():
                if isinstance(k, str):
                    _check_string(k, path, f"the key {_show(k)}")
                stack.append((v, path + (k,)))
        elif isinstance(o, list):
            stack.extend((v, path + (i,)) for i, v in enumerate(o))


@functools.cache
def _typed_columns() -> dict[str, Any]:
    """The trial columns typed parameters are copied into, by name (``repo.TYPED_PARAMS``),
    and the longest parameter name ``trial_params`` holds."""
    import sqlalchemy as sa

    from orchestrator.store.models import Trial, TrialParam
    from orchestrator.store.repo import TYPED_PARAMS

    cols = {c: Trial.__table__.c[c].type for c in TYPED_PARAMS}
    name_type = TrialParam.__table__.c["name"].type
    assert isinstance(name_type, sa.String)
    return {"columns": cols, "name_length": name_type.length}


def _typed_value_error(v: Any, col_type: Any) -> str | None:
    """Why ``v`` cannot go into the typed column (None: it can). A boolean is never a number."""
    import sqlalchemy as sa

    if isinstance(col_type, sa.Integer):
        ok = (
            not isinstance(v, bool)
            and isinstance(v, (int, float))
            and (isinstance(v, int) or v.is_integer())
            and abs(v) <= MAX_STEP
        )
        return None if ok else f"an integer within 32 bits, got {_show(v)}"
    if isinstance(col_type, sa.Float):  # Double
        ok = not isinstance(v, bool) and isinstance(v, (int, float))
        return None if ok else f"a number, got {_show(v)}"
    if isinstance(col_type, sa.String):
        if not isinstance(v, str):
            return f"a string, got {_show(v)}"
        if col_type.length is not None and len(v) > col_type.length:
            return f"at most {col_type.length} characters, got {len(v)}"
    return None


def checked_flat_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` flattened to dotted names, refusing what flattening would silently resolve
    or the store cannot hold: a name given twice (``{"task.K": 8, "task": {"K": 16}}``), an
    empty name or dotted part (``""``, ``"task."``, ``".K"``), control characters in a name,
    a name longer than ``trial_params.name``, and typed parameters of the wrong type."""
    typed = _typed_columns()
    out: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = [("", params)]
    while stack:
        prefix, obj = stack.pop()
        for k, v in obj.items():
            name = f"{prefix}{k}"
            if isinstance(v, dict):
                stack.append((f"{name}.", v))
                continue
            if any(not part.strip() for part in name.split(".")):
                raise ValueError(f"parameter name {_show(name)}: an empty name or dotted part")
            if any(unicodedata.category(c) == "Cc" for c in name):
                raise ValueError(f"parameter name {_show(name)}: contains a control character")
            if len(name) > typed["name_length"]:
                raise ValueError(f"parameter name {_show(name)}: longer than {typed['name_length']} characters")
            if name in out:
                raise ValueError(
                    f"parameter {_show(name)} is given twice (a dotted key and a nested object flatten to it)"
                )
            folded = unicodedata.normalize("NFC", name).casefold()
            twin = next((n for n in out if unicodedata.normalize("NFC", n).casefold() == folded), None)
            if twin is not None:
                raise ValueError(f"parameters {_show(twin)} and {_show(name)} differ only in case or Unicode form")
            out[name] = v
    for name, col_type in typed["columns"].items():
        if name in out and out[name] is not None:
            why = _typed_value_error(out[name], col_type)
            if why:
                raise ValueError(f"{name} must be {why} (the store keeps it in a typed column)")
    for name, adapter in _spec_bounds().items():
        if name in out and out[name] is not None:
            try:
                adapter.validate_python(out[name])
            except ValidationError as exc:
                msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
                raise ValueError(f"{name} {_show(out[name])}: {msg} (the bound a spec holds it to)") from None
    return out


@functools.cache
def _spec_bounds() -> dict[str, Any]:
    """A validator per numeric trial parameter (``seed``, ``lr``, ``steps``, ...) with the
    bounds a spec's trials are held to (``params.TrialParams``): an import stores no trial a
    spec would refuse (a seed of -5, an lr of 9.2e18)."""
    import typing

    from pydantic import TypeAdapter

    from orchestrator.params import TrialParams

    out: dict[str, Any] = {}
    for name, info in TrialParams.model_fields.items():
        kinds = set(typing.get_args(info.annotation)) - {type(None)} or {info.annotation}
        # PositiveInt | None: the union's member is Annotated[int, Gt(0)]
        kinds = {typing.get_args(k)[0] if typing.get_origin(k) is typing.Annotated else k for k in kinds}
        if kinds and kinds <= {int, float}:
            args = (info.annotation, *info.metadata)
            ann: Any = typing.Annotated[args] if info.metadata else info.annotation
            out[name] = TypeAdapter(ann)
    return out


class ImportRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    params: dict[str, Any] = Field(min_length=1)
    trace: list[TracePoint] = Field(min_length=1)
    # The record format's words for an outcome, each stored as the Status of that value.
    status: Literal["completed", "diverged", "failed"] = "completed"
    error: StrictStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        check_text(data)
        return data

    @field_validator("params")
    @classmethod
    def _scalar_params(cls, v: dict[str, Any]) -> dict[str, Any]:
        stack: list[tuple[Any, int]] = [(v, 0)]
        while stack:
            obj, depth = stack.pop()
            if depth > MAX_PARAM_DEPTH:
                raise ValueError(f"params nested deeper than {MAX_PARAM_DEPTH} levels")
            if isinstance(obj, dict):
                stack.extend((x, depth + 1) for x in obj.values())
            elif isinstance(obj, list):
                stack.extend((x, depth + 1) for x in obj)
            elif isinstance(obj, float) and not math.isfinite(obj):
                raise ValueError(f"a parameter value is {obj!r} (not a finite number)")
        checked_flat_params(v)
        return v

    @model_validator(mode="after")
    def _unique_steps(self) -> ImportRecord:
        seen: set[int] = set()
        for p in self.trace:
            if p.step in seen:
                raise ValueError(f"trace has step {p.step} twice")
            seen.add(p.step)
        return self

    @property
    def diverged(self) -> bool:
        return any(not p.finite for p in self.trace)

    @property
    def stored_status(self) -> str:
        """A run whose trace went non-finite is diverged, as the training loop records it."""
        return Status.diverged.value if self.status == Status.completed and self.diverged else self.status


@dataclass(slots=True)
class Checked:
    """A validated record as compact as it can be kept until the file's one transaction: its
    parameters, its points as tuples (step, the eval point's numbers in their order, metrics),
    the status to store and the error. A pydantic model per trace point is tens of times the
    point's JSON."""

    params: dict[str, Any]
    points: list[tuple[Any, ...]]
    status: str
    error: str | None

    @classmethod
    def of(cls, rec: ImportRecord) -> Checked:
        points = [(p.step, *(getattr(p, INPUT_NAMES[n]) for n in NUMBERS), p.model_extra or None) for p in rec.trace]
        return cls(rec.params, points, rec.stored_status, rec.error)

    def rows(self, trial_id: int) -> Iterator[dict[str, Any]]:
        for step, *numbers, metrics in self.points:
            yield {
                "trial_id": trial_id,
                "step": step,
                **dict(zip(NUMBERS, numbers)),
                "metrics": dict(metrics) if metrics else None,
            }


class DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of two equal keys; an import refuses to guess which was meant.
    obj: dict[str, Any] = {}
    for k, v in pairs:
        if k in obj:
            raise DuplicateKey(k)
        obj[k] = v
    return obj


def _constant(token: str) -> float:
    # NaN, Infinity and -Infinity, as Python's json.dumps writes a diverged loss.
    return float(token.replace("Infinity", "inf"))


def _int(token: str) -> int:
    v = int(token)
    if abs(v) > MAX_INT:
        raise ValueError(f"integer {token[:24]}{'...' if len(token) > 24 else ''} is beyond 64 bits")
    return v


def check_sweep_name(sweep: str) -> None:
    if not isinstance(sweep, str) or not SWEEP_NAME.fullmatch(sweep):
        raise UserError(
            f"--sweep {sweep!r}: a sweep name is letters, digits, '_', '.', '-' "
            "(starting with a letter or digit, at most 200), as in specs"
        )


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in err["loc"])
    loc = loc.replace(".[", "[")
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def read_source(path: Path) -> str:
    """The text of ``path``: a regular file (a symlink to one is fine) of at most
    :data:`MAX_IMPORT_BYTES`, checked on the open descriptor before anything is read, so a
    device (``/dev/zero``), a FIFO or a folder is refused at once instead of read without
    bound or waited on; UTF-8."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, not a file of JSON lines") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        # The descriptor's own type and size: a path checked before opening could be swapped.
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{path}: is a folder, not a file of JSON lines")
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: not a regular file (a device, FIFO or socket); import reads files only")
        if st.st_size > MAX_IMPORT_BYTES:
            raise UserError(f"{path}: {st.st_size:,} bytes, above the {MAX_IMPORT_BYTES:,}-byte limit of an import")
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            # Never more than the limit, even if the file grows after the check.
            data = fh.read(MAX_IMPORT_BYTES + 1)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > MAX_IMPORT_BYTES:
        raise UserError(f"{path}: grew past the {MAX_IMPORT_BYTES:,}-byte limit of an import while being read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


ROWS_PER_WRITE = 20_000  # eval rows an import hands the store at a time (one transaction)


def _lines(text: str):
    start = 0
    while start <= len(text):
        end = text.find("\n", start)
        if end == -1:
            yield text[start:]
            return
        yield text[start:end]
        start = end + 1


def parse_file(path: Path) -> list[tuple[int, Checked]]:
    """``(line number, record)`` of every non-blank line; every malformed line is reported
    (the first few by number) in one :class:`UserError`."""
    text = read_source(path)
    records, errors = [], []
    # Lines end at "\n" only: str.splitlines would also split inside a JSON string holding a
    # raw U+2028 or U+0085, which JSON allows unescaped. Taken one at a time, not as a list.
    for lineno, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_constant=_constant, parse_int=_int, object_pairs_hook=_unique_keys)
        except RecursionError:
            errors.append(f"line {lineno}: nested too deeply")
            continue
        except DuplicateKey as exc:
            errors.append(f"line {lineno}: the key {_show(exc.args[0])} appears twice in one object")
            continue
        except (json.JSONDecodeError, ValueError) as exc:
            errors.append(f"line {lineno}: invalid JSON ({getattr(exc, 'msg', exc)})")
            continue
        if not isinstance(obj, dict):
            errors.append(f"line {lineno}: expected a JSON object with params and trace")
            continue
        try:
            rec = ImportRecord.model_validate(obj)
        except ValidationError as exc:
            errors.append(f"line {lineno}: {_describe(exc)}")
            continue
        records.append((lineno, Checked.of(rec)))
    if errors:
        shown = "; ".join(errors[:MAX_REPORTED])
        more = f" (and {len(errors) - MAX_REPORTED} more)" if len(errors) > MAX_REPORTED else ""
        raise UserError(f"{path}: {len(errors)} malformed line(s), nothing imported: {shown}{more}")
    if not records:
        raise UserError(f"{path}: no records (expected one JSON object per line)")
    return records


def write_records(
    db: str | Engine | None,
    sweep: str,
    records: Sequence[Checked | ImportRecord | dict[str, Any]],
    source: str = "records",
    linenos: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Write records (validated :class:`ImportRecord` or plain dicts of the same shape) into
    ``sweep`` in one transaction, through the store's repo functions. A new sweep is
    created with a spec text naming ``source``; an existing sweep keeps its spec. Returns
    counts: trials given, new trials, eval rows written."""
    import sqlalchemy as sa

    from orchestrator.store.engine import open_store_engine

    check_sweep_name(sweep)
    linenos = list(linenos) if linenos is not None else list(range(1, len(records) + 1))
    keyed: list[tuple[str, dict[str, Any], Checked]] = []
    seen: dict[str, int] = {}
    for lineno, raw in zip(linenos, records):
        try:
            if isinstance(raw, Checked):
                rec = raw
            else:
                rec = Checked.of(raw if isinstance(raw, ImportRecord) else ImportRecord.model_validate(raw))
        except ValidationError as exc:
            raise UserError(f"{source}: record {lineno}: {_describe(exc)}") from None
        params = checked_flat_params(rec.params)
        key = record_key(params)
        if key in seen:
            raise UserError(
                f"{source}: line {lineno} has the same params as line {seen[key]} "
                "(add a distinguishing parameter such as seed); nothing imported"
            )
        seen[key] = lineno
        keyed.append((key, params, rec))
    engine = db if isinstance(db, Engine) else open_store_engine(db)[0]
    digest = hashlib.sha256(json.dumps([p for _, p, _ in keyed], sort_keys=True, default=str).encode()).hexdigest()
    try:
        # Two imports (or an import and a `submit`) creating the same new sweep at once: the
        # loser's insert breaks the name's uniqueness; it then finds the winner's row and goes
        # on (an import of its own) or is refused (a submitted sweep), never a traceback.
        for attempt in range(2):
            try:
                return _write(engine, sweep, keyed, source, digest)
            except sa.exc.IntegrityError as exc:
                if attempt:
                    raise UserError(
                        f"sweep {sweep!r}: the import conflicted with another writer; nothing imported"
                    ) from exc
        raise AssertionError("unreachable")
    finally:
        if engine is not db:  # the engine opened here (a caller's own is left open)
            engine.dispose()


def _write(
    engine: Engine, sweep: str, keyed: list[tuple[str, dict[str, Any], Checked]], source: str, digest: str
) -> dict[str, Any]:
    import sqlalchemy as sa

    from orchestrator.store import dialect, reader, repo
    from orchestrator.store.models import Trial

    with engine.begin() as conn:
        # SQLite: the write lock now, so a concurrent writer waits instead of failing the upgrade.
        dialect.for_connection(conn).lock_for_claim(conn)
        found = reader.find_sweep(conn, sweep)
        if found is None:
            sid = repo.upsert_sweep(conn, sweep, f"{IMPORTED_PREFIX}{source}\n", digest, origin=reader.ORIGIN_IMPORT)
        elif reader.sweep_origin(conn, sweep) != reader.ORIGIN_IMPORT:
            # Its trials are real runs of `submit`: an import must never rewrite them.
            raise UserError(
                f"sweep {sweep!r} was created by `orchestrator submit`; import into a new sweep name (nothing imported)"
            )
        else:
            sid = found[0]
        before = set(conn.execute(sa.select(Trial.key).where(Trial.sweep_id == sid)).scalars())
        ids = repo.add_trials(conn, sid, [(k, p) for k, p, _ in keyed])
        # Every point, finite or not: the store writes a non-finite value as NULL and names
        # it in ``nonfinite``, so a finite accuracy beside a NaN loss is kept.
        # In chunks, inside the one transaction: the rows of a whole file as dicts at once
        # would be many times the file's size.
        n_rows = 0
        chunk: list[dict[str, Any]] = []
        for k, _, rec in keyed:
            chunk.extend(rec.rows(ids[k]))
            if len(chunk) >= ROWS_PER_WRITE:
                n_rows += repo.upsert_evals(conn, chunk)
                chunk = []
        n_rows += repo.upsert_evals(conn, chunk) if chunk else 0
        for k, _, rec in keyed:
            repo.finish_trial(conn, ids[k], rec.status, error=rec.error)
    return {
        "sweep": sweep,
        "trials": len(keyed),
        "new_trials": sum(1 for k, _, _ in keyed if k not in before),
        "evals": n_rows,
        "diverged": sum(1 for _, _, rec in keyed if rec.status == Status.diverged),
    }


def import_jsonl(db: str | Engine | None, path: str | Path, sweep: str) -> dict[str, Any]:
    """Import ``path`` into ``sweep`` (see :func:`write_records`)."""
    path = Path(path)
    check_sweep_name(sweep)
    parsed = parse_file(path)
    source = text_of_path(path.name)
    res = write_records(db, sweep, [r for _, r in parsed], source=source, linenos=[n for n, _ in parsed])
    return {**res, "file": text_of_path(str(path))}


def text_of_path(name: str) -> str:
    """A file name as storable, printable text: a name that is not UTF-8 comes from the OS
    with its bytes as lone surrogates, which no database (or UTF-8 terminal) accepts; they
    are written as ``\\xff`` escapes."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
