"""``orchestrator import``: traces produced elsewhere become trials of a sweep.

One JSON object per line::

    {"params": {"arm": "mlstm", "seed": 3, "lr": 0.003, ...},
     "trace": [{"step": 1, "acc": 0.01, "loss": 4.5}, {"step": 200, "acc": 0.03}, ...],
     "status": "completed"}

``params`` may be nested (it is flattened to dotted names, as the store keeps them);
``status`` (completed, diverged or failed; default completed) and ``error`` (text) are
optional. Each trace point needs an int ``step`` and an ``acc`` in [0, 1]; ``loss``,
``train_loss``, ``lr`` and ``elapsed_s`` fill their columns and any other key goes into
the row's ``metrics``.
Every line is validated before anything is written, and the whole file is written in one
transaction: a malformed file imports nothing. Re-importing a file is idempotent (trial
keys come from the parameters, eval rows are upserts).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlalchemy.engine import Engine

from orchestrator.errors import UserError
from orchestrator.keys import trial_key  # the same identity the runner gives its trials

EVAL_FIELDS = ("loss", "train_loss", "elapsed_s")
MAX_REPORTED = 5


class TracePoint(BaseModel):
    model_config = ConfigDict(extra="allow")

    step: int = Field(ge=0)
    acc: float = Field(ge=0.0, le=1.0)
    loss: float | None = None
    train_loss: float | None = None
    lr: float | None = None
    elapsed_s: float | None = None

    @field_validator("step", mode="before")
    @classmethod
    def _integral(cls, v: Any) -> Any:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()) \
                or isinstance(v, str):
            raise ValueError("step must be an integer")
        return v

    def row(self, trial_id: int) -> dict[str, Any]:
        extra = dict(self.model_extra or {})
        # A trace point's ``lr`` is the step's learning rate: the store's ``step_lr``.
        return {"trial_id": trial_id, "step": self.step, "acc": self.acc,
                **{f: getattr(self, f) for f in EVAL_FIELDS}, "step_lr": self.lr,
                "metrics": extra or None}


class ImportRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    params: dict[str, Any] = Field(min_length=1)
    trace: list[TracePoint] = Field(min_length=1)
    status: Literal["completed", "diverged", "failed"] = "completed"
    error: str | None = None

    @model_validator(mode="after")
    def _unique_steps(self) -> ImportRecord:
        seen: set[int] = set()
        for p in self.trace:
            if p.step in seen:
                raise ValueError(f"trace has step {p.step} twice")
            seen.add(p.step)
        return self


def _reject_constants(token: str):
    raise ValueError(f"{token} is not a JSON number")


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
            obj = json.loads(line, parse_constant=_reject_constants)
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
        raise UserError(f"{path}: {len(errors)} malformed line(s), nothing imported: "
                        f"{shown}{more}")
    if not records:
        raise UserError(f"{path}: no records (expected one JSON object per line)")
    return records


def write_records(db: str | Engine | None, sweep: str,
                  records: Sequence[ImportRecord | dict[str, Any]], source: str = "records",
                  linenos: Sequence[int] | None = None) -> dict[str, Any]:
    """Write records (validated :class:`ImportRecord` or plain dicts of the same shape) into
    ``sweep`` in one transaction, through the store's repo functions. A new sweep is
    created with a spec text naming ``source``; an existing sweep keeps its spec. Returns
    counts: trials given, new trials, eval rows written."""
    import sqlalchemy as sa

    from orchestrator.store import repo
    from orchestrator.store.engine import open_store_engine
    from orchestrator.store.models import Trial

    if not sweep.strip():
        raise UserError("--sweep must name a sweep")
    linenos = list(linenos) if linenos is not None else list(range(1, len(records) + 1))
    keyed: list[tuple[str, dict[str, Any], ImportRecord]] = []
    seen: dict[str, int] = {}
    for lineno, raw in zip(linenos, records):
        try:
            rec = raw if isinstance(raw, ImportRecord) else ImportRecord.model_validate(raw)
        except ValidationError as exc:
            raise UserError(f"{source}: record {lineno}: {_describe(exc)}") from None
        params = repo.flatten_params(rec.params)
        key = trial_key(params)
        if key in seen:
            raise UserError(f"{source}: line {lineno} has the same params as line {seen[key]} "
                            "(add a distinguishing parameter such as seed); nothing imported")
        seen[key] = lineno
        keyed.append((key, params, rec))
    engine = db if isinstance(db, Engine) else open_store_engine(db)[0]
    digest = hashlib.sha256(json.dumps([p for _, p, _ in keyed], sort_keys=True,
                                       default=str).encode()).hexdigest()
    with engine.begin() as conn:
        sid = repo.sweep_id(conn, sweep)
        if sid is None:
            sid = repo.upsert_sweep(conn, sweep, f"# imported from {source}\n", digest)
        before = set(conn.execute(sa.select(Trial.key).where(Trial.sweep_id == sid)).scalars())
        ids = repo.add_trials(conn, sid, [(k, p) for k, p, _ in keyed])
        rows = [pt.row(ids[k]) for k, _, rec in keyed for pt in rec.trace]
        n_rows = repo.upsert_evals(conn, rows)
        for k, _, rec in keyed:
            repo.finish_trial(conn, ids[k], rec.status, error=rec.error)
    return {"sweep": sweep, "trials": len(keyed),
            "new_trials": sum(1 for k, _, _ in keyed if k not in before), "evals": n_rows}


def import_jsonl(db: str | Engine | None, path: str | Path, sweep: str) -> dict[str, Any]:
    """Import ``path`` into ``sweep`` (see :func:`write_records`)."""
    path = Path(path)
    if not sweep.strip():
        raise UserError("--sweep must name a sweep")
    parsed = parse_file(path)
    res = write_records(db, sweep, [r for _, r in parsed], source=path.name,
                        linenos=[n for n, _ in parsed])
    return {**res, "file": str(path)}
