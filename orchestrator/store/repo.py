"""Reads and writes of sweeps, trials and eval rows.

The runner's driver-side callback is the only writer during a sweep; eval rows are upserts
keyed by (trial_id, step), so a resumed trial that re-reports a step rewrites it, never
duplicates it.
"""

from __future__ import annotations

import json
import json.encoder
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from orchestrator import evals
from orchestrator.errors import UserError
from orchestrator.params import flatten_params
from orchestrator.status import SETTLED, Status
from orchestrator.store.models import (
    Attempt,
    Driver,
    Eval,
    KeyRename,
    SequentialLook,
    SpecVersion,
    SweepRow,
    SystemMetric,
    Trial,
    TrialCheckpoint,
    TrialError,
    TrialParam,
    TrialStop,
)
from orchestrator.store.reader import ORIGIN_IMPORT, ORIGIN_RUNNER, SAMPLE_COLUMNS, find_sweep, sweep_origin
from orchestrator.store.sweep_store import SweepStore
from sqlalchemy.engine import Connection, Engine

from orchestrator.store import attempts, claims, dialect

# The ``evals`` columns besides its key, and the number columns among them in the order
# ``nonfinite`` names them: the eval point's (orchestrator/evals.py).
EVAL_COLUMNS = evals.STORED
EVAL_NUMBERS = evals.NUMBERS
# Typed trial columns copied from the resolved parameters.
TYPED_PARAMS = ("arm", "task", "seed", "lr", "batch_size", "steps", "eval_every")


def _clean_float(x: Any) -> float | None:
    """NaN/inf cannot round-trip through every backend; store them as NULL."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _param_row(trial_id: int, name: str, value: Any) -> dict[str, Any]:
    num = None
    if isinstance(value, bool):
        num = float(value)
    elif isinstance(value, (int, float)):
        num = _clean_float(value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return {"trial_id": trial_id, "name": name, "value_num": num, "value_text": text}


def upsert_sweep(conn: Connection, name: str, spec_text: str, spec_hash: str, *, origin: str = ORIGIN_RUNNER) -> int:
    """Create the sweep row (made by ``origin``: the runner or an import) or refresh its spec
    (a spec may grow seeds; the origin of an existing row never changes); returns its id."""
    if origin not in (ORIGIN_RUNNER, ORIGIN_IMPORT):
        raise ValueError(f"sweep origin {origin!r}: expected {ORIGIN_RUNNER!r} or {ORIGIN_IMPORT!r}")
    row = conn.execute(sa.select(SweepRow.id).where(SweepRow.name == name)).first()
    if row is None:
        return conn.execute(
            sa.insert(SweepRow)
            .values(name=name, spec_text=spec_text, spec_hash=spec_hash, origin=origin)
            .returning(SweepRow.id)
        ).scalar_one()
    conn.execute(
        sa.update(SweepRow)
        .where(SweepRow.id == row.id)
        .values(spec_text=spec_text, spec_hash=spec_hash, updated_at=sa.func.now())
    )
    return row.id


def imported_refusal(name: str) -> str:
    """Why the runner refuses to run the sweep ``name`` (``orchestrator import`` made it)."""
    return (
        f"sweep {name!r} was made by `orchestrator import`: its trials are imported records, not runs "
        "to submit, resume or join; give the spec another name"
    )


def ensure_sweep(db: Engine | SweepStore, name: str, spec_text: str, spec_hash: str) -> int:
    """The sweep's id, creating the row (with this spec) when it is new. Two drivers racing
    to create the same sweep both get the one row (the name is unique). A sweep that
    ``orchestrator import`` made is refused: its trials are records, not runs to continue."""
    store = db if isinstance(db, SweepStore) else SweepStore(db)
    for _ in range(2):
        found, origin = store.read(lambda conn: (find_sweep(conn, name), sweep_origin(conn, name)))
        if found is not None:
            if origin == ORIGIN_IMPORT:
                raise UserError(imported_refusal(name))
            return found[0]
        try:
            return store.write(
                lambda conn: conn.execute(
                    sa.insert(SweepRow)
                    .values(name=name, spec_text=spec_text, spec_hash=spec_hash, origin=ORIGIN_RUNNER)
                    .returning(SweepRow.id)
                ).scalar_one()
            )
        except sa.exc.IntegrityError:
            continue  # the other driver created it first
    raise RuntimeError(f"sweep {name!r}: cannot create or find its row")


@dataclass
class Shrunk:
    """A trial a spec would give fewer steps than it has already run."""

    key: str
    ran: int
    steps: int


@dataclass
class DesignDiff:
    """What a re-submitted spec changes in a sweep's set of trials."""

    added: list[str] = field(default_factory=list)  # keys new to the sweep
    revived: list[str] = field(default_factory=list)  # superseded keys the spec has again
    superseded: list[str] = field(default_factory=list)  # active keys the spec no longer has
    # Same trial, new budget/execution settings/tags (keys.non_identity): params updated in place.
    updated: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> new params
    extended: list[str] = field(default_factory=list)  # updated keys given more steps that can continue
    shrunk: list[Shrunk] = field(default_factory=list)  # refused: a budget below what ran
    changes: list[str] = field(default_factory=list)  # "steps: 200 -> 400", ...
    first: bool = False  # the sweep had no trials: nothing to compare

    @property
    def changed(self) -> bool:
        return not self.first and bool(self.added or self.revived or self.superseded or self.updated)

    def summary(self) -> str:
        parts = [f"{len(self.added) + len(self.revived)} trial(s) added", f"{len(self.superseded)} superseded"]
        if self.extended:
            parts.append(f"{len(self.extended)} budget(s) extended")
        relabelled = len(self.updated) - len(self.extended)
        if relabelled:
            parts.append(f"{relabelled} trial(s) with new settings or tags")
        what = f" ({'; '.join(self.changes)})" if self.changes else ""
        return ", ".join(parts) + what

    def refusal(self) -> str | None:
        """One line when the spec asks a trial for fewer steps than it has run, else None."""
        if not self.shrunk:
            return None
        worst = max(self.shrunk, key=lambda s: s.ran - s.steps)
        return (
            f"steps {worst.steps} is below the {worst.ran} step(s) trial {worst.key} has already run "
            f"({len(self.shrunk)} trial(s) affected): a trial's budget can only grow"
        )


def _values(params: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for p in params:
        for k, v in p.items():
            out.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    return out


def _change_lines(old: Iterable[Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> list[str]:
    old_v, new_v = _values(old), _values(new)
    lines = []
    for name in sorted(set(old_v) | set(new_v)):
        a, b = old_v.get(name, set()), new_v.get(name, set())
        if a != b and a and b:
            lines.append(f"{name}: {', '.join(sorted(a))} -> {', '.join(sorted(b))}")
    return lines


def _as_dict(params: Any) -> dict[str, Any]:
    return params if isinstance(params, dict) else json.loads(params)


def design_diff(conn: Connection, sweep: int, trials: Sequence[tuple[str, Mapping[str, Any]]]) -> DesignDiff:
    """Compare a spec's (key, params) trials with the sweep's stored ones.

    A stored trial under the same key is the same trial (keys.py): where only its budget,
    execution settings or tags differ, it is ``updated`` in place, and ``extended`` when its
    ``steps`` grew and it can go on (not diverged, skipped or ended by the stop rule). A
    budget below what a trial has run is ``shrunk`` (the caller refuses it)."""
    ran = sa.select(sa.func.max(Eval.step)).where(Eval.trial_id == Trial.id).correlate(Trial).scalar_subquery()
    stopped = sa.exists().where(TrialStop.trial_id == Trial.id)
    stored = {
        r.key: r
        for r in conn.execute(
            sa.select(Trial.key, Trial.status, Trial.params, ran.label("ran"), stopped.label("stopped")).where(
                Trial.sweep_id == sweep
            )
        )
    }
    if not stored:
        return DesignDiff(first=True)
    new = dict(trials)
    diff = DesignDiff()
    before: list[dict[str, Any]] = []
    after: list[Mapping[str, Any]] = []
    for k, params in new.items():
        row = stored.get(k)
        if row is None:
            diff.added.append(k)
            after.append(params)
            continue
        old = _as_dict(row.params)
        if row.status == Status.superseded:
            diff.revived.append(k)
            if old == dict(params):
                after.append(params)
        if old == dict(params):
            continue
        diff.updated[k] = dict(params)
        before.append(old)
        after.append(params)
        steps, old_steps, done = int(params.get("steps") or 0), int(old.get("steps") or 0), int(row.ran or 0)
        if steps < done:
            diff.shrunk.append(Shrunk(k, done, steps))
        elif steps > old_steps and row.status not in (Status.diverged, Status.skipped) and not row.stopped:
            diff.extended.append(k)
    diff.superseded = [k for k, r in stored.items() if r.status != Status.superseded and k not in new]
    before += [_as_dict(stored[k].params) for k in diff.superseded]
    diff.changes = _change_lines(before, after)
    return diff


def apply_design(conn: Connection, sweep: int, diff: DesignDiff) -> None:
    """Mark the trials a spec dropped ``superseded`` (kept, never run, hidden from analysis),
    bring back the superseded ones it has again, and write the new budgets, settings and tags
    of the ones it keeps (an extended trial that had completed goes back to ``pending``: it
    continues from its checkpoint)."""
    if diff.shrunk:
        raise ValueError(diff.refusal())
    if diff.superseded:
        conn.execute(
            sa.update(Trial)
            .where(Trial.sweep_id == sweep, Trial.key.in_(diff.superseded))
            .values(status=Status.superseded.value, updated_at=sa.func.now())
        )
    if diff.revived:
        conn.execute(
            sa.update(Trial)
            .where(Trial.sweep_id == sweep, Trial.key.in_(diff.revived))
            .values(status=Status.pending.value, updated_at=sa.func.now())
        )
    for key, params in diff.updated.items():
        tid = conn.execute(sa.select(Trial.id).where(Trial.sweep_id == sweep, Trial.key == key)).scalar_one()
        values: dict[str, Any] = {c: params.get(c) for c in TYPED_PARAMS}
        if key in diff.extended:
            values["status"] = sa.case(
                (Trial.status == Status.completed.value, Status.pending.value), else_=Trial.status
            )
        update_trial(conn, tid, params=params, **values)
        conn.execute(sa.delete(TrialParam).where(TrialParam.trial_id == tid))
        rows = [_param_row(tid, n, v) for n, v in flatten_params(params).items()]
        if rows:
            conn.execute(sa.insert(TrialParam), rows)


def record_spec_version(
    conn: Connection, sweep: int, spec_text: str, spec_hash: str, *, code_change: str | None = None
) -> int:
    """The version number of this spec text in the sweep's history, adding it (as the newest)
    when it differs from the newest one, or when the run accepted a ``code_change`` (the
    one-line difference ``--allow-code-change`` let through, kept with the new version)."""
    last = conn.execute(
        sa.select(SpecVersion.version, SpecVersion.spec_hash)
        .where(SpecVersion.sweep_id == sweep)
        .order_by(SpecVersion.version.desc())
        .limit(1)
    ).first()
    if last is not None and last.spec_hash == spec_hash and code_change is None:
        return last.version
    version = (last.version if last is not None else 0) + 1
    conn.execute(
        sa.insert(SpecVersion).values(
            sweep_id=sweep, version=version, spec_text=spec_text, spec_hash=spec_hash, code_change=code_change
        )
    )
    return version


def key_renames(conn: Connection, sweep: int) -> list[tuple[str, str]]:
    """(old key, new key) of the sweep's trials re-keyed by migration 0005_identity."""
    return [
        (r.old_key, r.new_key)
        for r in conn.execute(sa.select(KeyRename.old_key, KeyRename.new_key).where(KeyRename.sweep_id == sweep))
    ]


REGISTER_CHUNK = 1000  # trials a bulk insert registers


def add_trials(
    conn: Connection, sweep: int, trials: Sequence[tuple[str, Mapping[str, Any]]], spec_version: int | None = None
) -> dict[str, int]:
    """Insert the (key, params) trials that are new to the sweep (created by spec version
    ``spec_version``); existing keys are left as they are. Returns key -> trial id for all
    given keys."""
    existing = dict(conn.execute(sa.select(Trial.key, Trial.id).where(Trial.sweep_id == sweep)).all())
    new = {k: p for k, p in trials if k not in existing}
    keys = list(new)
    # Bulk inserts and a read of the ids, a chunk of trials at a time, not two statements a
    # trial: registering a 20,000-trial sweep is seconds, a trial costs the database no
    # statement of its own before it runs, and the rows built at once stay a chunk's (all
    # 20,000 at once were a 240 MB peak in the driver).
    for i in range(0, len(keys), REGISTER_CHUNK):
        chunk = keys[i : i + REGISTER_CHUNK]
        conn.execute(
            sa.insert(Trial),
            [
                {
                    "sweep_id": sweep,
                    "key": key,
                    "params": dict(new[key]),
                    "spec_version": spec_version,
                    **{c: new[key].get(c) for c in TYPED_PARAMS},
                }
                for key in chunk
            ],
        )
        ids = dict(
            conn.execute(sa.select(Trial.key, Trial.id).where(Trial.sweep_id == sweep, Trial.key.in_(chunk))).all()
        )
        existing.update(ids)
        rows = [_param_row(ids[key], n, v) for key in chunk for n, v in flatten_params(new[key]).items()]
        if rows:
            conn.execute(sa.insert(TrialParam), rows)
    return {k: existing[k] for k, _ in trials}


EVAL_FIELDS = ("trial_id", "step") + EVAL_COLUMNS
_SET = ", ".join(f"{c} = excluded.{c}" for c in EVAL_COLUMNS)


def _nonfinite_name(x: float) -> str:
    return "nan" if x != x else ("inf" if x > 0 else "-inf")


def _clean_json(value: Any, path: str, marks: list[str]) -> Any:
    """``value`` with every non-finite number replaced by null (JSON has no NaN, and
    PostgreSQL's json type refuses the ``NaN`` token), each one named in ``marks``."""
    if isinstance(value, float) and not math.isfinite(value):
        marks.append(f"{path}={_nonfinite_name(value)}")
        return None
    if isinstance(value, Mapping):
        return {k: _clean_json(v, f"{path}.{k}", marks) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean_json(v, f"{path}[{i}]", marks) for i, v in enumerate(value)]
    return value


def _marked_tuple(r: Mapping[str, Any]) -> tuple:
    """:func:`eval_tuple` of a row holding a non-finite number (or a value the fast path
    leaves to this one): each number and metric checked and named on its own."""
    marks: list[str] = []
    numbers = []
    for c in EVAL_NUMBERS:
        x = r.get(c)
        if x is not None and not math.isfinite(float(x)):
            marks.append(f"{c}={_nonfinite_name(float(x))}")
        numbers.append(_clean_float(x))
    metrics = r.get("metrics")
    metrics = _clean_json(metrics, "metrics", marks) if metrics else None
    return (
        int(r["trial_id"]),
        int(r["step"]),
        *numbers,
        json.dumps(metrics, sort_keys=True, allow_nan=False) if metrics else None,
        ",".join(marks) or None,
    )


def _json_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, sort_keys=True, allow_nan=False)`` made once: ``dumps`` builds its
    encoder again on every call, which costs as much as encoding a row's few metrics. Like
    ``dumps`` it raises ValueError on a non-finite float."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the stdlib's own, still built once
        return json.JSONEncoder(sort_keys=True, allow_nan=False).encode
    # (markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys,
    # allow_nan), as JSONEncoder.iterencode passes them for dumps' defaults
    encode = make(
        None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ": ", ", ", True, False, False
    )
    return lambda value: "".join(encode(value, 0))


_encode_json = _json_encoder()


def eval_tuple(r: Mapping[str, Any]) -> tuple:
    """One row's values. A non-finite number cannot round-trip through every backend: it is
    stored as NULL and named in ``nonfinite`` (``loss=nan,metrics.rebind_loss=inf``), so the
    row, and every finite value in it, is kept and the NULL is not mistaken for a value that
    was never recorded.

    Every row of a sweep passes here, nearly all of them finite: those take one check of
    all their numbers and one encoding of their metrics (which refuses a non-finite float);
    a row that fails either is built again by :func:`_marked_tuple`, which names each one."""
    get = r.get
    return _finite_tuple(r["trial_id"], r["step"], map(get, EVAL_NUMBERS), get("metrics")) or _marked_tuple(r)


_point_numbers = operator.attrgetter(*EVAL_NUMBERS)


def point_tuple(trial_id: int, point: evals.EvalPoint) -> tuple:
    """:func:`eval_tuple` of a trial's :class:`~orchestrator.evals.EvalPoint`, read off the
    point itself: the driver's writer stores every row of a sweep, and building a mapping
    first cost it as much as the row's upsert (issue 34's ingest share)."""
    return _finite_tuple(trial_id, point.step, _point_numbers(point), point.metrics) or _marked_tuple(
        {"trial_id": trial_id, **vars(point)}
    )


def _finite_tuple(trial_id: Any, step: Any, numbers: Iterable[Any], metrics: Any) -> tuple | None:
    """The row's values when every number and metric is finite; None when the row needs
    :func:`_marked_tuple` (a non-finite value, or one left to the full path)."""
    try:
        values = [x if x is None or type(x) is float else float(x) for x in numbers]
        # filter(None, ...) drops None and 0.0, both of which pass anyway.
        if not all(map(math.isfinite, filter(None, values))):
            return None
        text = _encode_json(metrics) if metrics else None
    except (TypeError, ValueError):  # a non-finite metric, or a value left to the full path
        return None
    return (int(trial_id), int(step), *values, text, None)


def upsert_evals(conn: Connection, rows: Iterable[Mapping[str, Any]]) -> int:
    """Write eval rows (dicts with trial_id, step and EVAL_COLUMNS) as one batched upsert
    inside the caller's transaction.

    This is the hot path of every sweep, so it talks to the driver directly: one prepared
    executemany on SQLite; COPY into a staging table and one INSERT ... ON CONFLICT on
    PostgreSQL (row-at-a-time upserts manage a fraction of that)."""
    return upsert_eval_tuples(conn, map(eval_tuple, rows))


def upsert_eval_tuples(conn: Connection, tuples: Iterable[tuple]) -> int:
    """:func:`upsert_evals` of rows already built by :func:`eval_tuple` or :func:`point_tuple`."""
    # The last report of a (trial, step) wins; one statement may not touch a row twice.
    dedup = {(t[0], t[1]): t for t in tuples}
    if not dedup:
        return 0
    batch = list(dedup.values())
    dialect.for_connection(conn).upsert(conn, "evals", EVAL_FIELDS, _SET, batch)
    return len(batch)


_SYSTEM_FIELDS = ("trial_id", "step", "attempt") + SAMPLE_COLUMNS
_SYSTEM_SET = ", ".join(f"{c} = excluded.{c}" for c in ("attempt",) + SAMPLE_COLUMNS)
_SYSTEM_INTS = {"rss_bytes", "gpu_mem_bytes"}


def upsert_system_metrics(
    conn: Connection, rows: Iterable[Mapping[str, Any]], numbers: Mapping[int, int] | None = None
) -> int:
    """Write system_metrics rows (dicts with trial_id, step and SAMPLE_COLUMNS) as one
    batched upsert on (trial_id, step) inside the caller's transaction, as
    :func:`upsert_evals`; each row is tagged with its trial's newest attempt (the one whose
    worker measured it: the writer stores a report after the attempt it belongs to), from
    ``numbers`` where the caller knows it, else read. A non-finite number is stored as NULL."""
    dedup = {(int(r["trial_id"]), int(r["step"])): r for r in rows}
    if not dedup:
        return 0
    newest = dict(numbers or {})
    unknown = sorted({t for t, _ in dedup if t not in newest})
    if unknown:
        newest.update(attempts.newest_attempts(conn, unknown))

    def value(c: str, x: Any) -> Any:
        x = _clean_float(x)
        return int(x) if x is not None and c in _SYSTEM_INTS else x

    batch = [(t, s, newest.get(t), *(value(c, r.get(c)) for c in SAMPLE_COLUMNS)) for (t, s), r in dedup.items()]
    dialect.for_connection(conn).upsert(conn, "system_metrics", _SYSTEM_FIELDS, _SYSTEM_SET, batch)
    return len(batch)


def update_trial(conn: Connection, trial_id: int, **values: Any) -> None:
    """Change one trial's row; ``updated_at`` moves with every change, since the UI's change
    stamp and the recent-trials reads (reader.py) poll on it."""
    conn.execute(sa.update(Trial).where(Trial.id == trial_id).values(updated_at=sa.func.now(), **values))


def running_values() -> dict[str, Any]:
    """A trial's row as it starts running (its attempts counted, its error cleared)."""
    return {
        "status": Status.running.value,
        "attempts": Trial.attempts + 1,
        "error": None,
        "started_at": sa.func.coalesce(Trial.started_at, sa.func.now()),
        "heartbeat_at": sa.func.now(),
    }


def mark_running(conn: Connection, trial_id: int) -> None:
    update_trial(conn, trial_id, **running_values())


def placement_values(
    host: str | None,
    node_id: str | None,
    device: str | None,
    gpu_fraction: float | None = None,
    accelerator: str | None = None,
) -> dict[str, Any]:
    """Where a trial runs, as its row's values."""
    return {
        "host": host,
        "node_id": node_id,
        "device": device,
        "gpu_fraction": gpu_fraction,
        "accelerator": accelerator,
    }


def set_placement(
    conn: Connection,
    trial_id: int,
    host: str | None,
    node_id: str | None,
    device: str | None,
    gpu_fraction: float | None = None,
    accelerator: str | None = None,
) -> None:
    update_trial(conn, trial_id, **placement_values(host, node_id, device, gpu_fraction, accelerator))


def finish_trial(
    conn: Connection, trial_id: int, status: str, error: str | None = None, *, release: bool = False
) -> None:
    """Close a trial; its final metrics are read back from its own eval rows (in the one
    UPDATE: the writer ends many trials a flush, issue 34). ``release``: its claim is let go
    and its heartbeat stamped by the same statement (the writer's end of a trial it holds)."""
    last = sa.select(Eval.step).where(Eval.trial_id == trial_id).order_by(Eval.step.desc()).limit(1).scalar_subquery()

    def at_last(column):
        return sa.select(column).where(Eval.trial_id == trial_id, Eval.step == last).scalar_subquery()

    update_trial(
        conn,
        trial_id,
        status=status,
        error=error,
        finished_at=sa.func.now(),
        final_step=last,
        final_acc=at_last(Eval.acc),
        final_loss=at_last(Eval.loss),
        best_acc=sa.select(sa.func.max(Eval.acc)).where(Eval.trial_id == trial_id).scalar_subquery(),
        **({"claimed_by": None, "claim_expires_at": None, "heartbeat_at": sa.func.now()} if release else {}),
    )


def record_error(conn: Connection, trial_id: int, error: str) -> None:
    """A failed attempt that will be retried: keep the error text, stay running."""
    update_trial(conn, trial_id, error=error)


def add_trial_error(conn: Connection, trial_id: int, kind: str, error: str, traceback: str | None) -> None:
    """Keep one failed attempt's full story (``kind``: config or runtime)."""
    attempt = conn.execute(sa.select(Trial.attempts).where(Trial.id == trial_id)).scalar_one_or_none()
    conn.execute(
        sa.insert(TrialError).values(trial_id=trial_id, attempt=attempt, kind=kind, error=error, traceback=traceback)
    )


def release_unfinished(conn: Connection, sweep: int) -> int:
    """Trials left 'running' by a driver that died, interrupted ones, and failed ones go back
    to 'pending' (they resume from their checkpoints), unless a live driver holds a claim on
    them (store/claims.py): those are its to run. A 'running' trial here has no live driver
    (its open attempt ends as ``lost``). Returns how many."""
    rows = conn.execute(
        sa.select(Trial.id, Trial.status).where(
            Trial.sweep_id == sweep,
            Trial.status.in_((Status.running.value, Status.failed.value, Status.interrupted.value)),
            claims.free(conn),
        )
    ).all()
    attempts.close_attempts(conn, [r.id for r in rows if r.status == Status.running.value], attempts.LOST)
    if rows:
        conn.execute(
            sa.update(Trial)
            .where(Trial.id.in_([r.id for r in rows]))
            .values(status=Status.pending.value, updated_at=sa.func.now())
        )
    return len(rows)


def unfinished_trials(conn: Connection, sweep: int) -> list[tuple[int, str, dict]]:
    """(id, key, params) of trials to run: not completed, diverged, skipped or superseded;
    in insertion order."""
    return [
        tuple(r)
        for r in conn.execute(
            sa.select(Trial.id, Trial.key, Trial.params)
            .where(Trial.sweep_id == sweep, Trial.status.notin_([s.value for s in SETTLED]))
            .order_by(Trial.id)
        ).all()
    ]


def delete_sweep(conn: Connection, sweep: int) -> dict[str, int]:
    """Delete a sweep and everything under it (trials, params, evals, errors, system metrics) in the
    caller's transaction; returns the row counts removed. The deletes are explicit rather
    than left to ON DELETE CASCADE, so a SQLite connection opened without foreign keys
    cannot leave orphans either."""
    tids = sa.select(Trial.id).where(Trial.sweep_id == sweep).scalar_subquery()
    counts = {}
    for name, model in (
        ("evals", Eval),
        ("trial_params", TrialParam),
        ("trial_errors", TrialError),
        ("attempts", Attempt),
        ("trial_checkpoints", TrialCheckpoint),
        ("trial_stops", TrialStop),
        ("system_metrics", SystemMetric),
    ):
        counts[name] = conn.execute(sa.delete(model).where(model.trial_id.in_(tids))).rowcount or 0
    counts["trials"] = conn.execute(sa.delete(Trial).where(Trial.sweep_id == sweep)).rowcount or 0
    for keyed in (SpecVersion, SequentialLook, KeyRename, Driver):
        conn.execute(sa.delete(keyed).where(keyed.sweep_id == sweep))
    conn.execute(sa.delete(SweepRow).where(SweepRow.id == sweep))
    return counts


def statuses(conn: Connection, trial_ids: Sequence[int]) -> list[str]:
    """The stored status of each given trial (order not kept)."""
    if not trial_ids:
        return []
    return list(conn.execute(sa.select(Trial.status).where(Trial.id.in_(list(trial_ids)))).scalars())


def count_trials(conn: Connection, sweep: int) -> int:
    return conn.execute(sa.select(sa.func.count(Trial.id)).where(Trial.sweep_id == sweep)).scalar_one()


# ---- designs (orchestrator/design): sequential looks, skipped seeds, early stops ----------


def sweep_trials(conn: Connection, sweep: int) -> list[tuple[int, str, dict, str]]:
    """(id, key, params, status) of every trial of the sweep, in insertion order."""
    return [
        tuple(r)
        for r in conn.execute(
            sa.select(Trial.id, Trial.key, Trial.params, Trial.status).where(Trial.sweep_id == sweep).order_by(Trial.id)
        ).all()
    ]


def trial_outcomes(conn: Connection, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """id -> {status, stopped_at, trace: [(step, acc, nonfinite), ...]} in step order, the
    rows the events are computed from (``nonfinite``: the point holds a non-finite value, as
    the analysis reads ``evals.nonfinite``; ``stopped_at``: the stop rule's step, or None)."""
    if not ids:
        return {}
    wanted = list(ids)
    out: dict[int, dict[str, Any]] = {
        r.id: {"status": r.status, "stopped_at": None, "trace": []}
        for r in conn.execute(sa.select(Trial.id, Trial.status).where(Trial.id.in_(wanted)))
    }
    for stop in conn.execute(sa.select(TrialStop.trial_id, TrialStop.step).where(TrialStop.trial_id.in_(wanted))):
        out[stop.trial_id]["stopped_at"] = stop.step
    for r in conn.execute(
        sa.select(Eval.trial_id, Eval.step, Eval.acc, Eval.nonfinite.is_not(None).label("nonfinite"))
        .where(Eval.trial_id.in_(wanted))
        .order_by(Eval.trial_id, Eval.step)
    ):
        out[r.trial_id]["trace"].append((r.step, r.acc, bool(r.nonfinite)))
    return out


def sequential_looks(conn: Connection, sweep: int) -> list[dict[str, Any]]:
    """The stored looks of a sweep: [{stratum (JSON text), look, decision, record}] in order."""
    return [
        dict(r._mapping)
        for r in conn.execute(
            sa.select(SequentialLook.stratum, SequentialLook.look, SequentialLook.decision, SequentialLook.record)
            .where(SequentialLook.sweep_id == sweep)
            .order_by(SequentialLook.id)
        )
    ]


def record_look(
    conn: Connection, sweep: int, stratum: str, look: int, decision: str, record: Mapping[str, Any]
) -> None:
    conn.execute(
        sa.insert(SequentialLook).values(
            sweep_id=sweep, stratum=stratum, look=look, decision=decision, record=dict(record)
        )
    )


def skip_trials(conn: Connection, ids: Sequence[int], reason: str) -> int:
    """Mark never-run trials ``skipped`` with ``reason``; trials that already ran keep theirs."""
    if not ids:
        return 0
    res = conn.execute(
        sa.update(Trial)
        .where(Trial.id.in_(list(ids)), Trial.status == Status.pending.value)
        .values(status=Status.skipped.value, error=reason, updated_at=sa.func.now())
    )
    return res.rowcount or 0


def record_stop(conn: Connection, trial_id: int, step: int, budget: int, reason: str) -> None:
    """A trial the spec's ``stop:`` rule ended at ``step`` of ``budget`` (rewritten on a rerun)."""
    conn.execute(sa.delete(TrialStop).where(TrialStop.trial_id == trial_id))
    conn.execute(sa.insert(TrialStop).values(trial_id=trial_id, step=step, budget=budget, reason=reason))
