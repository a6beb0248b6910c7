"""The group-sequential driver: run a sweep's seeds look by look until each contrast is decided.

``sweep.py`` hands a sweep with a ``sequential:`` block to :func:`drive` (one call site) with a
function that runs a batch of trials. For look k the driver runs every still-open stratum's
trials whose seed is among the axis's first ``looks[k]`` values, tests each open contrast on
exactly those seeds (``design.sequential.decide_strata``: Lan-Demets boundaries, Bonferroni
over strata), stores each look's record and, for a decided contrast, marks its remaining
seeds ``skipped`` ("decided at look k") in the same transaction. A resume replays the stored
looks instead of re-testing them, so a crash between looks neither re-tests with different
data nor loses a decision; a look whose decision was not stored is tested on the same seeds
(they are finished and deterministic), so it decides the same way.

The events are the analysis's conventions (lock-in at budget: the final, or best, eval's
accuracy >= ``lockin``; escape: the first eval after the first with accuracy >= ``escape_at``,
else censored at the last eval), computed here from the stored trace with the thresholds
the spec resolved (``Sweep.thresholds``) because the runner never imports the analysis.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from orchestrator.design.sequential import (
    FisherData,
    LookRecord,
    SequentialSpec,
    SurvivalData,
    decide_strata,
    strata_cells,
    stratum_key,
)
from orchestrator.errors import UserError
from orchestrator.status import FINISHED, Status
from orchestrator.store import repo
from orchestrator.store.outage import write_with_retry

if TYPE_CHECKING:  # the runner reaches the database only through orchestrator.store
    from sqlalchemy.engine import Connection, Engine

SEED_AXIS = "seed"
Batch = list[tuple[int, str, dict[str, Any]]]


@dataclass
class SequentialRun:
    """What the driver did: trials run per look, outcomes, the looks decided this run."""

    ran: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    records: list[LookRecord] = field(default_factory=list)


def _stratum_text(cell: Mapping[str, Any]) -> str:
    return json.dumps(cell, sort_keys=True, default=str)


def _record(d: Mapping[str, Any]) -> LookRecord:
    return LookRecord(**d)


def lock_in(outcome: Mapping[str, Any], thresholds: Mapping[str, Any]) -> bool:
    """Lock-in at budget, as the analysis defines it (final or best eval >= lockin)."""
    trace = _cut(outcome["trace"], thresholds.get("horizon"))
    accs = [a for _, a in trace if a is not None]
    if not accs:
        return False
    value = max(accs) if thresholds.get("metric") == "best" else accs[-1]
    return value >= thresholds["lockin"]


def escape(outcome: Mapping[str, Any], thresholds: Mapping[str, Any]) -> tuple[float, bool]:
    """(time, event): the first eval after the first with acc >= escape_at, else the last step."""
    trace = _cut(outcome["trace"], thresholds.get("horizon"))
    for step, acc in trace[1:]:
        if acc is not None and acc >= thresholds["escape_at"]:
            return float(step), True
    return float(trace[-1][0] if trace else 0), False


def _cut(trace: Sequence[tuple[int, float | None]], horizon: int | None) -> list:
    return [p for p in trace if horizon is None or p[0] <= horizon]


def _record_looks(
    conn: Connection, *, sweep_id: int, look: int, decisions: Sequence[tuple[LookRecord, list[int] | None]]
) -> int:
    """Store look ``look``'s records, each with the seeds its decision leaves unrun (None: it
    goes on) marked skipped; returns how many were."""
    skipped = 0
    for rec, rest in decisions:
        repo.record_look(conn, sweep_id, _stratum_text(rec.stratum), look, rec.decision, rec.as_dict())
        if rest is not None:
            skipped += repo.skip_trials(conn, rest, f"decided at look {look}")
    return skipped


# A look's trial that has ended: it is tested (finished) or left out (failed, skipped).
_ENDED = {s.value for s in FINISHED} | {Status.failed.value, Status.skipped.value}


@dataclass
class GateStep:
    """What one pass of :class:`LookGate` found, inside its transaction."""

    open: list[int] | None  # the current look's unended trials; None: every look is decided
    records: list[LookRecord] = field(default_factory=list)  # looks decided in this pass
    skipped: int = 0


class LookGate:
    """Which trials of a sequential sweep may run now, for any number of drivers.

    Called in a claim transaction that holds the sweep (``store.claims.claim_batch``: the
    sweep row locked on PostgreSQL, the write lock on SQLite), it first decides every look
    whose trials have all ended and that is not stored yet: tests it, stores its records
    and marks the seeds its decisions leave unrun ``skipped``, in that transaction. So each
    look is decided exactly once, by whichever driver asks for work first after the look's
    last outcome is stored, and a look stored by another driver (or an earlier run) is read,
    never tested again. It returns the current look's trials that have not ended (None once
    every look is decided; the seeds beyond the last look are skipped then).

    A pass's in-memory effects wait for its transaction: :meth:`settle` after it commits (a
    transaction retried through an outage runs the pass again)."""

    def __init__(
        self,
        seq: SequentialSpec,
        axes: Mapping[str, Sequence[Any]],
        thresholds: Mapping[str, Any],
        sweep_id: int,
        on_look: Callable[[LookRecord], None] | None = None,
    ) -> None:
        self.seq, self.axes, self.thresholds, self.sweep_id, self.on_look = seq, axes, thresholds, sweep_id, on_look
        self.index = {s: i for i, s in enumerate(axes[SEED_AXIS])}
        self.cells = strata_cells(seq, axes)
        self.records: list[LookRecord] = []
        self.skipped = 0
        self.done = False
        self._step: GateStep | None = None

    def __call__(self, conn: Connection) -> list[int] | None:
        self._step = step = self._pass(conn)
        return step.open

    def settle(self) -> GateStep | None:
        """Take in the last pass once its transaction has committed."""
        step, self._step = self._step, None
        if step is None:
            return None
        self.records += step.records
        self.skipped += step.skipped
        self.done = step.open is None
        if self.on_look:
            for rec in step.records:
                self.on_look(rec)
        return step

    def _pass(self, conn: Connection) -> GateStep:
        seq, index = self.seq, self.index
        g0, g1 = seq.compare.groups
        trials = repo.sweep_trials(conn, self.sweep_id)
        prior: dict[tuple, list[LookRecord]] = {}
        for row in repo.sequential_looks(conn, self.sweep_id):
            prior.setdefault(stratum_key(seq, json.loads(row["stratum"])), []).append(_record(row["record"]))
        by_stratum: dict[tuple, list[tuple[int, str, dict, str]]] = {}
        for t in trials:
            by_stratum.setdefault(stratum_key(seq, t[2]), []).append(t)
        step = GateStep(open=None)
        for k, n_k in enumerate(seq.looks, start=1):
            keys = [stratum_key(seq, c) for c in self.cells]
            open_keys = [key for key in keys if not any(r.stopped for r in prior.get(key, []))]
            if not open_keys:
                break
            need = [key for key in open_keys if len(prior.get(key, [])) < k]
            if not need:
                continue  # this look is stored for every open stratum: replay, do not re-test
            members = {key: [t for t in by_stratum.get(key, []) if index[t[2][SEED_AXIS]] < n_k] for key in need}
            waiting = [t[0] for ts in members.values() for t in ts if t[3] not in _ENDED]
            if waiting:
                step.open = waiting
                return step
            decided = self._decide(conn, k, need, members, prior, g0, g1)
            decisions = [
                (
                    rec,
                    [t[0] for t in by_stratum.get(key, []) if index[t[2][SEED_AXIS]] >= n_k]
                    if rec.stopped and k < len(seq.looks)
                    else None,
                )
                for key, rec in decided.items()
            ]
            step.skipped += _record_looks(conn, sweep_id=self.sweep_id, look=k, decisions=decisions)
            for key, rec in decided.items():
                prior.setdefault(key, []).append(rec)
                step.records.append(rec)
            # The skips are in this transaction: read the statuses again for the next look.
            trials = repo.sweep_trials(conn, self.sweep_id)
            by_stratum = {}
            for t in trials:
                by_stratum.setdefault(stratum_key(seq, t[2]), []).append(t)
        # Seeds beyond the last look are not part of the design.
        beyond = [t[0] for t in trials if index[t[2][SEED_AXIS]] >= seq.looks[-1]]
        step.skipped += repo.skip_trials(conn, beyond, "beyond the last look")
        return step

    def _decide(self, conn: Connection, k: int, need: list, members: dict, prior: dict, g0: Any, g1: Any) -> dict:
        seq, thresholds = self.seq, self.thresholds
        results_db = repo.trial_outcomes(conn, [t[0] for ts in members.values() for t in ts])
        data: dict[tuple, dict[Any, FisherData | SurvivalData]] = {}
        for key in need:
            groups: dict[Any, list[Mapping[str, Any]]] = {g0: [], g1: []}
            for tid, _, params, _ in members[key]:
                res = results_db[tid]
                # Failed trials are left out (the information fraction shrinks accordingly).
                if params[seq.compare.by] in groups and res["status"] in [s.value for s in FINISHED]:
                    groups[params[seq.compare.by]].append(res)
            if seq.test == "fisher":
                data[key] = {
                    g: FisherData(n=len(rs), successes=sum(lock_in(r, thresholds) for r in rs))
                    for g, rs in groups.items()
                }
            else:
                ev = {g: [escape(r, thresholds) for r in rs] for g, rs in groups.items()}
                data[key] = {
                    g: SurvivalData(times=[t for t, _ in e], events=[bool(x) for _, x in e]) for g, e in ev.items()
                }
        try:
            return decide_strata(seq, self.axes, k, data, prior)
        except ValueError as exc:  # e.g. every seed of a group failed: nothing to test
            raise UserError(f"sequential look {k}: {exc}") from None


def drive(
    seq: SequentialSpec,
    axes: Mapping[str, Sequence[Any]],
    thresholds: Mapping[str, Any],
    sweep_id: int,
    engine: Engine,
    run: Callable[[Batch], dict[int, str]],
    on_look: Callable[[LookRecord], None] | None = None,
    *,
    write: Callable[[Callable[[Connection], Any]], Any] | None = None,
) -> SequentialRun:
    """Run the sweep's looks in this process, one driver alone: ``run(batch)`` runs trials to
    their end (trial_id -> status). ``write(fn)`` runs a transaction that writes (a look,
    skipped seeds): the driver session's ``write``; without one,
    ``store.outage.write_with_retry`` on ``engine``. Drivers that share a sweep use
    :class:`LookGate` through their claims instead (runner/feed.py)."""
    if write is None:
        write = partial(write_with_retry, engine)
    gate = LookGate(seq, axes, thresholds, sweep_id, on_look)
    out = SequentialRun()
    last: list[int] | None = None
    while True:
        ids = write(gate)
        gate.settle()
        if ids is None:
            break
        if ids == last:
            raise UserError(f"sequential design: trials {ids[:5]} did not end; the look cannot be tested")
        last = ids
        with engine.connect() as conn:
            batch = [(tid, key, params) for tid, key, params, _ in repo.sweep_trials(conn, sweep_id) if tid in set(ids)]
        for st in run(batch).values():
            out.outcomes[st] = out.outcomes.get(st, 0) + 1
        out.ran += len(batch)
    out.skipped, out.records = gate.skipped, gate.records
    return out
