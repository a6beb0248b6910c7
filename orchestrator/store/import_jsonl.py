"""``orchestrator import``: traces produced elsewhere become trials of a sweep.

One JSON object per line::

    {"params": {"arm": "mlstm", "seed": 3, "lr": 0.003, ...},
     "trace": [{"step": 1, "acc": 0.01, "loss": 4.5}, {"step": 200, "acc": 0.03}, ...],
     "status": "completed"}

``params`` may be nested (it is flattened to dotted names, as the store keeps them);
``status`` (completed, diverged or failed; default completed) and ``error`` (text) are
optional. Each trace point needs an int ``step`` and an ``acc`` in [0, 1]; ``loss``,
``train_loss``, ``lr`` and ``elapsed_s`` fill their columns and any other key goes into
the row's ``metrics``. Numbers are JSON numbers (a string is not one); ``NaN``,
``Infinity``, ``-Infinity`` (as Python's json writes them) and a literal that overflows
(``1e400``, read as the infinity it is) are accepted in ``acc``/``loss``/``train_loss``, and
``null`` in ``acc`` (no result) or a loss (not recorded): a run whose trace goes non-finite
(a NaN/inf loss, a NaN/inf/null acc) is stored as ``diverged``, as the training loop stores
its own, with the finite points as its evals. Integers beyond 64 bits are refused.
Imports never write into a sweep that ``submit`` created (its trials are real runs); the
sweep name follows the rule of spec names.
Every line is validated before anything is written, and the whole file is written in one
transaction: a malformed file imports nothing. Re-importing a file is idempotent (trial
keys come from the parameters, eval rows are upserts).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import Engine

from orchestrator.errors import UserError
from orchestrator.keys import record_key

EVAL_FIELDS = ("loss", "train_loss", "elapsed_s")
MAX_REPORTED = 5
# The same rule as spec names: a sweep name becomes a folder name (reports, checkpoints).
SWEEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")
IMPORTED_PREFIX = "# imported from "
MAX_INT = 2**63 - 1
MAX_STEP = 2**31 - 1  # evals.step is a 32-bit INTEGER on PostgreSQL
MAX_PARAM_DEPTH = 8


class TracePoint(BaseModel):
    model_config = ConfigDict(extra="allow")

    step: int = Field(ge=0, le=MAX_STEP)
    # None / NaN / +-inf mark a diverged run (see ImportRecord); a finite acc is in [0, 1].
    acc: StrictFloat | None
    loss: StrictFloat | None = None
    train_loss: StrictFloat | None = None
    lr: StrictFloat | None = None
    elapsed_s: StrictFloat | None = None

    @field_validator("step", mode="before")
    @classmethod
    def _integral(cls, v: Any) -> Any:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()) or isinstance(v, str):
            raise ValueError("step must be an integer")
        return v

    @field_validator("acc")
    @classmethod
    def _unit(cls, v: float | None) -> float | None:
        if v is not None and math.isfinite(v) and not 0.0 <= v <= 1.0:
            raise ValueError(f"acc must be in [0, 1], got {v!r}")
        return v

    @field_validator("lr", "elapsed_s")
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
        return all(v is None or math.isfinite(v) for v in (self.loss, self.train_loss))

    def row(self, trial_id: int) -> dict[str, Any]:
        extra = dict(self.model_extra or {})
        # A trace point's ``lr`` is the step's learning rate: the store's ``step_lr``.
        return {
            "trial_id": trial_id,
            "step": self.step,
            "acc": self.acc,
            **{f: getattr(self, f) for f in EVAL_FIELDS},
            "step_lr": self.lr,
            "metrics": extra or None,
        }


class ImportRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    params: dict[str, Any] = Field(min_length=1)
    trace: list[TracePoint] = Field(min_length=1)
    status: Literal["completed", "diverged", "failed"] = "completed"
    error: StrictStr | None = None

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
        return "diverged" if self.status == "completed" and self.diverged else self.status

    @property
    def finite_points(self) -> list[TracePoint]:
        return [p for p in self.trace if p.finite]


def _constant(token: str) -> float:
    # NaN, Infinity and -Infinity, as Python's json.dumps writes a diverged loss.
    return float(token.replace("Infinity", "inf"))


def _int(token: str) -> int:
    v = int(token)
    if abs(v) > MAX_INT:
        raise ValueError(f"integer {token[:24]}{'...' if len(token) > 24 else ''} is beyond 64 bits")
    return v


def check_sweep_name(sweep: str) -> None:
    if not isinstance(sweep, str) or not SWEEP_NAME.match(sweep):
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


def parse_file(path: Path) -> list[tuple[int, ImportRecord]]:
    """``(line number, record)`` of every non-blank line; every malformed line is reported
    (the first few by number) in one :class:`UserError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason})") from None
    records, errors = [], []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_constant=_constant, parse_int=_int)
        except RecursionError:
            errors.append(f"line {lineno}: nested too deeply")
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
        records.append((lineno, rec))
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
    records: Sequence[ImportRecord | dict[str, Any]],
    source: str = "records",
    linenos: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Write records (validated :class:`ImportRecord` or plain dicts of the same shape) into
    ``sweep`` in one transaction, through the store's repo functions. A new sweep is
    created with a spec text naming ``source``; an existing sweep keeps its spec. Returns
    counts: trials given, new trials, eval rows written."""
    import sqlalchemy as sa

    from orchestrator.store import repo
    from orchestrator.store.engine import open_store_engine
    from orchestrator.store.models import Trial

    check_sweep_name(sweep)
    linenos = list(linenos) if linenos is not None else list(range(1, len(records) + 1))
    keyed: list[tuple[str, dict[str, Any], ImportRecord]] = []
    seen: dict[str, int] = {}
    for lineno, raw in zip(linenos, records):
        try:
            rec = raw if isinstance(raw, ImportRecord) else ImportRecord.model_validate(raw)
        except ValidationError as exc:
            raise UserError(f"{source}: record {lineno}: {_describe(exc)}") from None
        params = repo.flatten_params(rec.params)
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
    with engine.begin() as conn:
        found = repo.find_sweep(conn, sweep)
        if found is None:
            sid = repo.upsert_sweep(conn, sweep, f"{IMPORTED_PREFIX}{source}\n", digest)
        elif not found[1].startswith(IMPORTED_PREFIX):
            # Its trials are real runs of `submit`: an import must never rewrite them.
            raise UserError(
                f"sweep {sweep!r} was created by `orchestrator submit`; import into a new sweep name (nothing imported)"
            )
        else:
            sid = found[0]
        before = set(conn.execute(sa.select(Trial.key).where(Trial.sweep_id == sid)).scalars())
        ids = repo.add_trials(conn, sid, [(k, p) for k, p, _ in keyed])
        rows = [pt.row(ids[k]) for k, _, rec in keyed for pt in rec.finite_points]
        n_rows = repo.upsert_evals(conn, rows)
        for k, _, rec in keyed:
            repo.finish_trial(conn, ids[k], rec.stored_status, error=rec.error)
    return {
        "sweep": sweep,
        "trials": len(keyed),
        "new_trials": sum(1 for k, _, _ in keyed if k not in before),
        "evals": n_rows,
        "diverged": sum(1 for _, _, rec in keyed if rec.stored_status == "diverged"),
    }


def import_jsonl(db: str | Engine | None, path: str | Path, sweep: str) -> dict[str, Any]:
    """Import ``path`` into ``sweep`` (see :func:`write_records`)."""
    path = Path(path)
    check_sweep_name(sweep)
    parsed = parse_file(path)
    res = write_records(db, sweep, [r for _, r in parsed], source=path.name, linenos=[n for n, _ in parsed])
    return {**res, "file": str(path)}
