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

The events are the analysis's own (``orchestrator.events``, the one definition of every event)
under the spec's whole ``analysis:`` block (``Sweep.analysis``): lock-in at budget, escape
time, collapse censoring, the ``diverged`` and ``stopped_as`` rules, the horizon; and the
log-rank is the one ``orchestrator analyze logrank`` reports (its variance from the block's
``logrank``). So a look decides on what the report will say.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from orchestrator.design.sequential import (
    FisherData,
    LookRecord,
    SequentialSpec,
    SurvivalData,
    decide_strata,
    strata_cells,
    stratum_key,
)
from orchestrator.analysis_config import AnalysisConfig
from orchestrator.errors import UserError
from orchestrator.events import events, n_stopped
from orchestrator.status import FINISHED, Status
from orchestrator.store import repo

if TYPE_CHECKING:  # the runner reaches the database only through orchestrator.store
    from sqlalchemy.engine import Connection

    from orchestrator.store.sweep_store import SweepStore

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


def look_events(results: Mapping[int, Mapping[str, Any]], cfg: AnalysisConfig) -> pd.DataFrame:
    """The events of a look's trials (``repo.trial_outcomes``: status, stopped_at, trace),
    indexed by trial id: exactly the analysis's (``orchestrator.events.events`` under the
    spec's whole analysis block: horizon, collapse, the ``diverged`` and ``stopped_as``
    rules). Trials outside ``cfg.statuses`` are left out, as the analysis leaves them out."""
    kept = {tid: r for tid, r in results.items() if r["status"] in cfg.statuses}
    trials = pd.DataFrame(
        {
            "trial_id": list(kept),
            "stopped_at": [float("nan") if r["stopped_at"] is None else float(r["stopped_at"]) for r in kept.values()],
        }
    )
    rows = [(tid, step, acc, nonfinite) for tid, r in kept.items() for step, acc, nonfinite in r["trace"]]
    evals = pd.DataFrame.from_records(rows, columns=["trial_id", "step", "acc", "nonfinite"])
    evals = evals.astype({"trial_id": np.int64, "step": np.int64, "acc": float, "nonfinite": bool})
    evals = evals.sort_values(["trial_id", "step"], kind="stable").reset_index(drop=True)
    _, with_events = events(trials, evals, cfg)
    return with_events.set_index("trial_id")


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
        cfg: AnalysisConfig,
        sweep_id: int,
        on_look: Callable[[LookRecord], None] | None = None,
    ) -> None:
        self.seq, self.axes, self.cfg, self.sweep_id, self.on_look = seq, axes, cfg, sweep_id, on_look
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
        results = repo.trial_outcomes(conn, [t[0] for ts in members.values() for t in ts])
        return decide_from_events(self.seq, self.axes, self.cfg, k, need, members, prior, results)


def decide_from_events(
    seq: SequentialSpec,
    axes: Mapping[str, Sequence[Any]],
    cfg: AnalysisConfig,
    k: int,
    need: list,
    members: Mapping[tuple, Sequence[tuple[int, str, dict, str]]],
    prior: Mapping[tuple, Sequence[LookRecord]],
    results: Mapping[int, Mapping[str, Any]],
) -> dict:
    """Test look ``k`` of the strata in ``need`` on their members' stored outcomes: the
    analysis's events, then the design's decision (``decide_strata``). A trial without events
    (failed, or outside the analysed statuses) is left out: the information fraction shrinks
    accordingly."""
    g0, g1 = seq.compare.groups
    ev = look_events(results, cfg)
    if seq.test == "fisher" and cfg.stopped_as is None and n_stopped(ev.reset_index()):
        raise UserError(
            f"sequential look {k}: trials ended by the stop rule have no lock-in at budget; "
            "set analysis.stopped_as: solved to count them as solved"
        )
    data: dict[tuple, dict[Any, FisherData | SurvivalData]] = {}
    for key in need:
        groups: dict[Any, list[int]] = {g0: [], g1: []}
        for tid, _, params, _ in members[key]:
            if params[seq.compare.by] in groups and tid in ev.index:
                groups[params[seq.compare.by]].append(tid)
        if seq.test == "fisher":
            data[key] = {
                g: FisherData(n=len(ids), successes=int(ev.loc[ids, "locked"].astype(bool).sum()))
                for g, ids in groups.items()
            }
        else:
            data[key] = {
                g: SurvivalData(
                    times=[float(t) for t in ev.loc[ids, "time"]], events=[bool(e) for e in ev.loc[ids, "event"]]
                )
                for g, ids in groups.items()
            }
    try:
        return decide_strata(seq, axes, k, data, prior, logrank=cfg.logrank)
    except ValueError as exc:  # e.g. every seed of a group failed: nothing to test
        raise UserError(f"sequential look {k}: {exc}") from None


def drive(
    seq: SequentialSpec,
    axes: Mapping[str, Sequence[Any]],
    cfg: AnalysisConfig,
    sweep_id: int,
    store: SweepStore,
    run: Callable[[Batch], dict[int, str]],
    on_look: Callable[[LookRecord], None] | None = None,
    *,
    write: Callable[[Callable[[Connection], Any]], Any] | None = None,
) -> SequentialRun:
    """Run the sweep's looks in this process, one driver alone: ``run(batch)`` runs trials to
    their end (trial_id -> status). ``write(fn)`` runs a transaction that writes (a look,
    skipped seeds): the driver session's ``write``; without one, ``store.write``. Drivers
    that share a sweep use
    :class:`LookGate` through their claims instead (runner/feed.py)."""
    if write is None:
        write = store.write
    gate = LookGate(seq, axes, cfg, sweep_id, on_look)
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
        rows = store.read(lambda conn: repo.sweep_trials(conn, sweep_id))
        batch = [(tid, key, params) for tid, key, params, _ in rows if tid in set(ids)]
        for st in run(batch).values():
            out.outcomes[st] = out.outcomes.get(st, 0) + 1
        out.ran += len(batch)
    out.skipped, out.records = gate.skipped, gate.records
    return out


@dataclass
class ReplayedLook:
    """One look of a design replayed on stored traces: what the live gate would have stored,
    and the seeds its decision would have left unrun (values of the seed axis, per group)."""

    record: LookRecord
    unrun: list[Any]

    def as_dict(self) -> dict[str, Any]:
        return {**self.record.as_dict(), "unrun_seeds": self.unrun, "trials_unrun": len(self.unrun) * 2}


def replay(
    seq: SequentialSpec,
    axes: Mapping[str, Sequence[Any]],
    cfg: AnalysisConfig,
    trials: Sequence[tuple[int, str, dict, str]],
    results: Mapping[int, Mapping[str, Any]],
) -> list[ReplayedLook]:
    """Decide every look of ``seq`` on a finished study's trials (``repo.sweep_trials`` rows
    and their ``repo.trial_outcomes``), writing nothing: look by look, each still-open
    stratum's trials whose seed is among the axis's first ``looks[k]``, decided by
    :func:`decide_from_events`, the function the live :class:`LookGate` decides with. Trials
    whose seed, group or stratum the design does not name are not part of it."""
    index = {s: i for i, s in enumerate(axes[SEED_AXIS])}
    cells = {stratum_key(seq, c) for c in strata_cells(seq, axes)}
    by_stratum: dict[tuple, list[tuple[int, str, dict, str]]] = {}
    for t in trials:
        params = t[2]
        if params.get(SEED_AXIS) not in index or params.get(seq.compare.by) not in seq.compare.groups:
            continue
        if any(name not in params for name in seq.strata or []) or stratum_key(seq, params) not in cells:
            continue
        by_stratum.setdefault(stratum_key(seq, params), []).append(t)
    if not by_stratum:
        raise UserError(
            f"no stored trial has a {SEED_AXIS} of the design's axis, a {seq.compare.by} among "
            f"{seq.compare.groups} and a stratum of the design"
        )
    prior: dict[tuple, list[LookRecord]] = {}
    out: list[ReplayedLook] = []
    for k, n_k in enumerate(seq.looks, start=1):
        need = [key for key in sorted(cells, key=str) if not any(r.stopped for r in prior.get(key, []))]
        if not need:
            break
        members = {key: [t for t in by_stratum.get(key, []) if index[t[2][SEED_AXIS]] < n_k] for key in need}
        decided = decide_from_events(seq, axes, cfg, k, need, members, prior, results)
        for key, rec in decided.items():
            prior.setdefault(key, []).append(rec)
            later = sorted(
                {t[2][SEED_AXIS] for t in by_stratum.get(key, []) if index[t[2][SEED_AXIS]] >= n_k},
                key=lambda s: index[s],
            )
            out.append(ReplayedLook(rec, later if rec.stopped and k < len(seq.looks) else []))
    return out
