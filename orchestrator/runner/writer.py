"""The driver-side Tune callback: the one process that writes the database during a sweep.

Eval rows are buffered and flushed as batched upserts (every ``flush_rows`` rows or
``flush_s`` seconds, before the feed claims more trials, and whenever a trial fails), each
trial's newest checkpoint in the same transaction as the rows it covers (or, with a checkpoint
folder, to its file right after that transaction). A trial's start (marked running, its
attempt begun, its placement) and its end are queued too and stored in the next flush, so in
the steady state the end of one trial, the start of the next and everyone's rows share one
transaction (issue 34: a commit per trial, not five), and the feed's next claim runs last in
it (``flush(then=...)``). Within a flush the order is the one a trial lives in: starts, then
rows, checkpoints, heartbeats and consoles, then ends (an end reads its final metrics from
its rows). A start that would delete rows still buffered for its trial (a new attempt
deletes the rows past its checkpoint) flushes them first. The statements a trial costs are
few (issue 34): a flush's ownership check, the heartbeat of the trials it writes for and
each trial's start on its row (its running mark, placement and the new attempt's read) are
one UPDATE ... RETURNING; then each attempt is one INSERT; a trial's end and the release of
its claim are one UPDATE; attempts are closed one statement per kind of end; the feed's
claim is one UPDATE ... RETURNING.

A row lost in the buffer when the driver dies was past every stored checkpoint: the attempt
that resumes the trial deletes the rows past its checkpoint and trains them again, so no
trace is stitched from two attempts. With the spec's ``keep_checkpoints: none`` a finished
trial's checkpoint is deleted in the transaction that stores its end.

A chain (runner/trainable._run_chain) sends its members' reports in batches
(``Report.all_from_wire``); each member is marked running when its attempt begins and ended
when its final comes, and the members a stopped or failed chain never began are let go (their
claims released in the next flush) for a later claim.

Each unit's first report starts one attempt per member (``store.attempts``: where and with
which code it runs, from which step); how the trial ends closes it. Every write goes through the driver session's one write path
(``DriverSession.write``), which rides out a database outage (store.outage): pending rows stay in the buffer until they land. A database that is gone (file deleted or replaced,
tables dropped) is not an outage: the first write that finds it raises DatabaseGone, the
driver session stops every trial, and nothing is written again.

What the trials report arrives as :class:`~orchestrator.runner.messages.Report` messages.

Errors: ``trials.error`` holds one line (exception type and message); each failed
attempt's full traceback goes to ``trial_errors``, and so does that of an exception that
ended a trial in its step (``diverged`` or ``failed`` without a retry, Trainer.step_raised).
The console gets one line per such trial (``on_event``), never the traceback. A trial that fails before its first step
(a configuration error: bad device, a model that cannot be built) reports itself failed
without raising, so Tune does not retry what would fail the same way every time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TYPE_CHECKING, TypeVar

from ray import tune

from orchestrator.runner import checkpoints
from orchestrator.runner.lifecycle import LOST
from orchestrator.runner.messages import AttemptStart, Checkpoint, EvalRow, Report, TrialFinal
from orchestrator.status import FINISHED, Status
from orchestrator.store import attempts, claims, repo

if TYPE_CHECKING:  # the runner reaches the database only through orchestrator.store
    from orchestrator.runner.lifecycle import DriverSession


T = TypeVar("T")


def _error_text(trial) -> str:
    text = None
    try:
        err = trial.get_pickled_error() or trial.get_error()
        text = str(err) if err is not None else None
    except Exception:  # pragma: no cover - storage hiccup; fall back to the file
        pass
    if not text and trial.error_file:
        try:
            with open(trial.error_file) as fh:
                text = fh.read()
        except OSError:
            text = None
    # Ray colours the worker's name in its tracebacks: a stored traceback is plain text.
    return _ANSI.sub("", text) if text else "trial failed (no error text recorded by Ray)"


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def one_line(text: str) -> str:
    """The exception line of a traceback (``Type: message``), at most 300 characters."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return "error (no text)"
    # Ray wraps the worker's traceback; the last line is the original exception.
    return lines[-1][:300]


@dataclass
class _Start:
    """A queued start of a unit's trials: marked running (Tune started the unit), or their
    attempts begun (the unit's first report: ``attempt``) with their placement (``placement``:
    the trials' row values, ``repo.placement_values``)."""

    tids: list[int]
    running: bool = False
    attempt: AttemptStart | None = None
    placement: dict[str, Any] | None = None


@dataclass
class _Unit:
    """What the writer follows of one running Tune trial: its members, whether it is a chain
    (members run one after another: runner/trainable._run_chain), the members whose attempt
    began and those whose end is queued or stored."""

    tids: list[int]
    chain: bool
    begun: set[int] = field(default_factory=set)
    ended: set[int] = field(default_factory=set)
    # Each member's training time so far (its newest row's ``elapsed_s``): what its trial
    # took, timed where it ran (a chain's reports reach the driver in batches).
    elapsed: dict[int, float] = field(default_factory=dict)

    def live(self) -> list[int]:
        """The members running now: a chain's begun and not ended, a unit's not ended."""
        if self.chain:
            return [t for t in self.tids if t in self.begun and t not in self.ended]
        return [t for t in self.tids if t not in self.ended]


@dataclass
class _End:
    """A queued end of a Tune trial: each member's final, and the checkpoints it drops."""

    trial: Any
    ends: dict[int, TrialFinal]
    dropped: list[int]


class StoreWriter(tune.Callback):
    def __init__(
        self,
        session: DriverSession,
        *,
        flush_rows: int = 2000,
        flush_s: float = 0.5,
        on_event: Callable[..., None] | None = None,
        checkpoint_folder: Path | None = None,
        sweep: str = "",
        keep_checkpoints: str = "final",
        on_duration: Callable[[float], None] | None = None,
    ):
        self.session = session  # the one write path, and the set of running trials it heartbeats
        self.flush_rows = flush_rows
        self.flush_s = flush_s
        self.on_event = on_event or (lambda *a, **k: None)
        self.checkpoint_folder = checkpoint_folder  # None: checkpoints go to the database
        self.sweep = sweep
        # ``none`` (the spec's keep_checkpoints): an ended trial's checkpoint goes with its end.
        self.keep_final = keep_checkpoints != "none"
        # Recorded with each attempt: the driver that claimed the trial (``drivers.owner``).
        self.driver = session.owner
        self._rows: list[EvalRow] = []
        self._system: list[dict[str, Any]] = []  # system_metrics rows, flushed with the eval rows
        self._ckpts: dict[int, Checkpoint] = {}  # each trial's newest, until flushed
        self._logs: dict[int, str] = {}  # each trial's newest console tail, until flushed
        self._keys: dict[int, str] = {}  # trial id -> stable key (checkpoint file names)
        self.checkpoint_bytes = 0
        self._touched: set[int] = set()
        self._starts: list[_Start] = []  # trials' starts, stored first in the next flush
        self._ends: list[_End] = []  # trials' ends, stored last in the next flush
        self._released: list[int] = []  # claims to give back in the next flush (_let_go)
        # Chain members a chain failed for good before they began, let go once (_attempt_failed).
        self._spared: set[int] = set()
        self._last_flush = time.monotonic()
        # The attempt number of each running trial this writer began (its rows and checkpoints
        # are tagged with it without reading it back); dropped with the trial's end.
        self._attempts: dict[int, int] = {}
        self.rows_written = 0
        self.outcomes: dict[int, str] = {}
        self._units: dict[str, _Unit] = {}  # Tune trial id -> what runs in it, while it runs
        self.units_started = 0  # Tune trials started (retries included): what the run cost Tune
        # Trials a chain was handed and never began (it stopped or failed first): let go here
        # for the next claim; not counted as run.
        self.released: set[int] = set()
        # Each ended member's training seconds (the feed's chains: feed.ChainPolicy).
        self.on_duration = on_duration or (lambda seconds: None)

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its run config (callbacks included) for its own experiment restore,
        # which we never use: a session and a progress closure cannot travel.
        state = self.__dict__.copy()
        state.update(
            session=None,
            on_event=None,
            _rows=[],
            _system=[],
            _touched=set(),
            _ckpts={},
            _logs={},
            _starts=[],
            _ends=[],
            _released=[],
            _attempts={},
            _units={},
            on_duration=None,
        )
        return state

    def _tids(self, trial) -> list[int]:
        """Our trial ids behind one Tune trial (a lone trial, or every member of a pack or a
        chain)."""
        members = trial.config["unit"]["members"]
        self._keys.update((int(m["trial_id"]), m["key"]) for m in members)
        return [int(m["trial_id"]) for m in members]

    def _unit(self, trial) -> _Unit:
        """The writer's record of ``trial`` (made at its first sight; a Tune retry keeps it)."""
        unit = self._units.get(trial.trial_id)
        if unit is None:
            unit = self._units[trial.trial_id] = _Unit(self._tids(trial), bool(trial.config["unit"].get("chain")))
        return unit

    def _running(self, tids: list[int], alive: bool) -> None:
        (self.session.running.update if alive else self.session.running.difference_update)(tids)

    def _held(self, conn, tids: list[int]) -> list[int]:
        """Of ``tids``, those this driver still holds, locked for the caller's transaction
        (call it first in it): a driver cut off from the database longer than the TTL marks,
        begins, closes or ends nothing of a trial another driver took over meanwhile."""
        gone = claims.taken_from(conn, self.driver, tids)
        return [t for t in tids if t not in gone]

    def _pending(self) -> bool:
        return bool(
            self._rows
            or self._touched
            or self._ckpts
            or self._logs
            or self._system
            or self._starts
            or self._ends
            or self._released
        )

    def flush(self, then: Callable[[Any], T] | None = None) -> T | None:
        """Store everything buffered in one transaction (see the module's docstring); ``then``
        (the feed's next claim) runs last in the same transaction, and its result is returned:
        the end of one trial and the claim of the next share a commit."""
        if not self._pending():
            return self.session.write_if(then)
        rows, touched, ckpts, logs = list(self._rows), set(self._touched), dict(self._ckpts), dict(self._logs)
        system, starts, ends, released = list(self._system), list(self._starts), list(self._ends), list(self._released)
        to_db = self.checkpoint_folder is None

        def write(conn) -> tuple[int, set[int], dict[int, int], T | None]:
            # Nothing for a trial another driver took over while this one was cut off.
            ids = {r.trial_id for r in rows} | {int(m["trial_id"]) for m in system} | set(ckpts) | touched
            for s in starts:
                ids.update(s.tids)
            for e in ends:
                ids.update(e.ends)
            # Every trial the flush writes for is checked, locked and heartbeaten in one
            # statement, which also makes each trial's first start on its row (a trial whose
            # end it stores gets its heartbeat with that end too).
            steps = self._start_steps(starts)
            first: dict[int, attempts.RowStart] = {}
            for tid, step, _ in steps:
                first.setdefault(tid, step)
            held = claims.hold(conn, self.driver, ids, first)
            gone = held.gone
            begun = self._store_starts(conn, steps, held)
            numbers = {**self._attempts, **begun}
            n = repo.upsert_eval_tuples(
                conn, [repo.point_tuple(r.trial_id, r.point) for r in rows if r.trial_id not in gone]
            )
            repo.upsert_system_metrics(conn, [m for m in system if m["trial_id"] not in gone], numbers)
            if to_db:  # after the rows: a stored checkpoint never claims a row that is missing
                attempts.save_checkpoints(
                    conn,
                    [
                        attempts.StoredCheckpoint(c.trial_id, c.step, c.state)
                        for c in ckpts.values()
                        if c.trial_id not in gone
                    ],
                    numbers,
                )
            attempts.save_logs(conn, {t: text for t, text in logs.items() if t not in gone})
            self._store_ends(conn, ends, gone)
            claims.release(conn, self.driver, released)
            return n, gone, begun, then(conn) if then is not None else None

        # The buffer is cleared only once the rows are in: an outage keeps them pending.
        n, gone, begun, result = self.session.write(write)
        self.rows_written += n
        self._attempts.update(begun)
        if not to_db:
            assert self.checkpoint_folder is not None
            for c in ckpts.values():
                if c.trial_id in gone:
                    continue
                checkpoints.save(
                    checkpoints.trial_path(self.checkpoint_folder, self.sweep, self._keys[c.trial_id]), c.state
                )
        self.checkpoint_bytes += sum(len(c.state) for c in ckpts.values())
        del self._rows[: len(rows)]
        del self._system[: len(system)]
        del self._starts[: len(starts)]
        del self._ends[: len(ends)]
        del self._released[: len(released)]
        self._touched -= touched
        for tid, c in ckpts.items():
            if self._ckpts.get(tid) is c:
                del self._ckpts[tid]
        for tid, text in logs.items():
            if self._logs.get(tid) is text:
                del self._logs[tid]
        self._last_flush = time.monotonic()
        for e in ends:
            self._ended(e, gone)
        return result

    @staticmethod
    def _start_steps(starts: list[_Start]) -> list[tuple[int, attempts.RowStart, dict[str, Any]]]:
        """The queued starts as what they do to each trial's row, in order: a running mark
        and the attempt's start that follows it in one flush (a short trial, or a first
        report within ``flush_s`` of the start) are one step, with the placement and the
        attempt's read (and its environment); a trial started twice before an attempt has its
        first mark alone."""
        steps: list[tuple[int, attempts.RowStart, dict[str, Any]]] = []
        marked: set[int] = set()  # marked running, their attempt not yet begun
        for s in starts:
            if s.running:
                for tid in s.tids:
                    if tid in marked:
                        steps.append((tid, attempts.RowStart(repo.running_values()), {}))
                    marked.add(tid)
                continue
            from_steps = dict(s.attempt.from_steps) if s.attempt is not None else {}
            env = dict(s.attempt.env) if s.attempt is not None else {}
            for tid in s.tids:
                values = dict(s.placement or {})
                if tid in marked:
                    marked.discard(tid)
                    values.update(repo.running_values())
                if tid in from_steps:
                    steps.append((tid, attempts.RowStart(values, True, from_steps[tid]), env))
                elif values:
                    steps.append((tid, attempts.RowStart(values), {}))
        steps += [(tid, attempts.RowStart(repo.running_values()), {}) for tid in marked]
        return steps

    def _store_starts(
        self, conn, steps: list[tuple[int, attempts.RowStart, dict[str, Any]]], held: claims.Held
    ) -> dict[int, int]:
        """The queued starts of the trials still held; returns the attempts begun. Each
        trial's first step was made by the flush's first statement (``claims.hold``), which
        read for its attempt: only the attempt is recorded here. A later step (a trial
        restarted within the flush) is a statement of its own."""
        begun: dict[int, int] = {}
        folded: set[int] = set()
        for tid, step, env in steps:
            if tid in held.gone:
                continue
            first = tid not in folded
            folded.add(tid)
            if step.begins:
                begun[tid] = attempts.begin_attempt(
                    conn,
                    tid,
                    step.from_step,
                    env,
                    self.driver,
                    slurm_job=self.session.slurm_job,
                    trial_values=None if first else step.values,
                    read=held.reads[tid] if first else None,
                )
            elif not first:
                repo.update_trial(conn, tid, **step.values)
        return begun

    def _start(self, start: _Start) -> None:
        """Queue ``start`` for the next flush. Whatever is buffered for its trials (a previous
        attempt's rows, checkpoint or end) is stored first: the new attempt deletes what lies
        past its checkpoint."""
        mine = set(start.tids)
        if (
            any(r.trial_id in mine for r in self._rows)
            or any(int(m["trial_id"]) in mine for m in self._system)
            or mine & self._ckpts.keys()
            or any(mine & e.ends.keys() for e in self._ends)
        ):
            self.flush()
        self._starts.append(start)

    def on_step_begin(self, iteration, trials, **info):
        # The lease thread found the database gone: end Tune's loop now rather than let
        # each trial run on to its next report.
        if self.session.fatal is not None:
            raise self.session.fatal

    def on_trial_start(self, iteration, trials, trial, **info):
        self.units_started += 1
        unit = self._unit(trial)
        if not unit.chain:  # a chain's members are marked running one by one, as each begins
            self._start(_Start(unit.tids, running=True))
            self._running(unit.tids, True)
            self.on_event("start", trial, trial_ids=unit.tids)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        for report in Report.all_from_wire(result):
            self._take(trial, report)
        Report.trim_wire(result)  # what Tune keeps of it until the run ends

    def on_step_end(self, iteration, trials, **info):
        # What was taken (results, starts, ends) is stored here, at the end of Tune's step, at
        # most every flush_s, not as each result comes: Tune sends a unit its next train() only
        # after the result's callbacks, and the unit's report waits for that call (a commit
        # there held a chain of short trials a few milliseconds at every report).
        if self._pending() and (
            len(self._rows) >= self.flush_rows or time.monotonic() - self._last_flush >= self.flush_s
        ):
            self.flush()

    def _take(self, trial, report: Report) -> None:
        """One report of ``trial``'s unit (a chain sends several in one Tune result)."""
        unit = self._unit(trial)
        start, placement = report.attempt, report.placement
        if start is not None or placement is not None:
            config = trial.config["unit"]
            tids = [t for t, _ in start.from_steps] if start is not None else unit.tids
            if unit.chain:  # this member begins now: marked running with its attempt's start
                self._start(_Start(tids, running=True))
                self._running(tids, True)
                self.on_event("start", trial, trial_ids=tids)
            unit.begun.update(tids)
            # What the unit asked of its GPU, shared by its members (runner/fleet.py).
            # A chain asks for one member's share: they run one at a time.
            share = float(config["gpu"]) / (1 if unit.chain else len(unit.tids)) if config.get("gpu") else None
            accelerator = config.get("accelerator")
            where = (
                repo.placement_values(placement.host, placement.node_id, placement.device, share, accelerator)
                if placement is not None
                else None
            )
            self._start(_Start(tids, attempt=start, placement=where))
        self._rows.extend(report.evals)
        for r in report.evals:
            if r.point.elapsed_s is not None:
                unit.elapsed[r.trial_id] = r.point.elapsed_s
        self._system.extend(report.system_rows())
        for c in report.checkpoints:
            self._ckpts[c.trial_id] = c
        live = unit.live()
        if report.log is not None:
            for tid in live:  # a pack's members share their unit's console
                self._logs[tid] = report.log
        self._touched.update(live)
        if report.evals:
            self.on_event("result", trial, step=report.evals[-1].point.step, evals=list(report.evals))
        if report.finals:
            # Queued as they come: a chain's members end one by one within its Tune trial.
            self._end(trial, unit, {f.trial_id: f for f in report.finals if f.trial_id not in unit.ended})

    def _end(self, trial, unit: _Unit, ends: dict[int, TrialFinal]) -> None:
        """Queue the ends of ``unit``'s members in ``ends``; stored with the next flush (the
        feed's next claim, the timer, or the run's end)."""
        if not ends:
            return
        for tid, e in ends.items():
            if e.status != Status.interrupted and tid in unit.elapsed:
                self.on_duration(unit.elapsed[tid])
        unit.ended.update(ends)
        # Kept none: a finished trial's checkpoint would only be deleted again by its end. A
        # failed or interrupted one keeps it (a resume continues from there).
        dropped = [] if self.keep_final else [t for t, e in ends.items() if e.status in FINISHED]
        for tid in dropped:
            self._ckpts.pop(tid, None)
        self._ends.append(_End(trial, ends, dropped))
        # Not running from now on (a stopping driver's grace waits for what still runs).
        self._running(list(ends), False)

    def _let_go(self, unit: _Unit) -> list[int]:
        """A chain's members that never began (it stopped or failed first): let go now,
        stored with the next flush, for a later claim here or by another driver."""
        if not unit.chain:
            return []
        never = [t for t in unit.tids if t not in unit.begun and t not in unit.ended]
        unit.ended.update(never)
        self.released.update(never)
        self._released += never
        return never

    def on_trial_complete(self, iteration, trials, trial, **info):
        unit = self._units.pop(trial.trial_id, None) or _Unit(self._tids(trial), False)
        self._let_go(unit)
        # A final that only reached Tune's last result (not seen as a result here), or none:
        # Tune stopped the trial (a cancel) before it ended.
        reported = {f.trial_id: f for r in Report.all_from_wire(trial.last_result) for f in r.finals}
        rest = [t for t in unit.tids if t not in unit.ended]
        self._end(trial, unit, {tid: reported.get(tid) or TrialFinal(tid, Status.interrupted) for tid in rest})

    def _store_ends(self, conn, ends: list[_End], gone: set[int]) -> None:
        """The queued ends of the trials still held: their attempts closed (one statement a
        kind of end), each trial finished and let go in one statement (an interrupted one
        stays this driver's until it exits: it is not claimed again and again here)."""
        held = [(end, tid, end.ends[tid]) for end in ends for tid in end.ends if tid not in gone]
        closing: dict[tuple[str, str | None], list[int]] = {}
        for _, tid, e in held:
            closing.setdefault((e.status.value, e.failure.kind if e.failure else None), []).append(tid)
        for (outcome, kind), tids in closing.items():
            attempts.close_attempts(conn, tids, outcome, kind)
        stopped = [tid for _, tid, e in held if e.status == Status.interrupted]
        if stopped:
            claims.interrupt(conn, trial_ids=stopped)
        for _, tid, e in held:
            if e.status == Status.interrupted:
                continue
            if e.error and (e.failure is not None or e.status == Status.failed):
                kind = e.failure.kind if e.failure is not None else "runtime"
                tb = e.failure.traceback if e.failure is not None else None
                repo.add_trial_error(conn, tid, kind, e.error, tb)
            repo.finish_trial(conn, tid, e.status.value, e.error, release=True)
            if e.stop is not None:
                repo.record_stop(conn, tid, e.stop.step, e.stop.budget, e.stop.reason)
        attempts.drop_checkpoints(conn, [t for end in ends for t in end.dropped if t not in gone])

    def _ended(self, end: _End, gone: set[int]) -> None:
        """After its flush: what the driver does about an end it stored (or could not)."""
        taken = [t for t in end.ends if t in gone]
        if taken:
            # Its link came back after the trial ended here and was taken over there: this
            # driver stops as when its renewal finds a trial taken (one line, exit 130), rather
            # than carry on as if the trial were its own result.
            self.session.stop(f"{LOST} ({len(taken)} trial(s) taken over by another driver)")
        for tid in end.ends:
            self._attempts.pop(tid, None)
        if self.checkpoint_folder is not None:
            for tid in end.dropped:
                checkpoints.trial_path(self.checkpoint_folder, self.sweep, self._keys[tid]).unlink(missing_ok=True)
        for tid, e in end.ends.items():
            self._spared.discard(tid)  # ended: a later death of its chain is not its own
            if tid in gone:  # its end is the other driver's to store and to tell
                continue
            self.outcomes[tid] = e.status.value
            # An error worth a line of its own: a failure, or an exception that ended the trial.
            raised = e.status == Status.failed or e.failure is not None
            self.on_event(e.status.value, end.trial, trial_id=tid, error=e.error if raised else None)

    def _attempt_failed(self, trial, *, final: bool) -> tuple[list[int], str, list[int]]:
        """An attempt of ``trial`` raised: its traceback to ``trial_errors``; the trial is
        failed when Tune gives up on it (``final``), else it is retried. Returns its trial ids,
        the error line, and those of them spared: a chain's next member that never began,
        which is not failed the first time (the caller lets it go)."""
        self.flush()
        text = _error_text(trial)
        line = one_line(text)
        unit = self._unit(trial)
        # The members it ran: a chain's running one (or, failed between two, its next), never
        # those whose end is stored and let go.
        tids = unit.live()
        spared: list[int] = []
        if not tids:
            tids = [t for t in unit.tids if t not in unit.ended][:1]
            if final and unit.chain and tids and tids[0] not in self._spared:
                # Tune gave up on the chain before this member began: its worker died between
                # two members, or Tune handed the chain a cached actor that had died (its
                # retries then fail on that one actor at once). The member never ran: it is
                # let go for another try, its error kept. A second time it is failed: its own
                # set-up may be what kills the worker.
                self._spared.update(tids)
                spared = list(tids)

        failed = [t for t in tids if t not in spared]

        def write(conn) -> None:
            held = self._held(conn, tids)
            attempts.close_attempts(conn, held, Status.failed.value, "runtime")
            for tid in held:
                repo.add_trial_error(conn, tid, "runtime", line, text)
                if final and tid not in spared:
                    repo.finish_trial(conn, tid, Status.failed.value, line)
                else:
                    repo.record_error(conn, tid, line)
            if final:
                claims.release(conn, self.driver, failed)

        self.session.write(write)
        if final:
            self._spared.difference_update(failed)  # failed for good: nothing left to spare
        return failed, line, spared

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._attempt_failed(trial, final=False)
        self.on_event("retry", trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        tids, line, _ = self._attempt_failed(trial, final=True)
        unit = self._units.pop(trial.trial_id, None)
        if unit is not None:
            unit.ended.update(tids)
            self._let_go(unit)  # the members never begun, a spared one included
        self._running(tids, False)
        for tid in tids:
            self._attempts.pop(tid, None)
            self.outcomes[tid] = Status.failed.value
            self.on_event(Status.failed.value, trial, trial_id=tid, error=line)

    def on_experiment_end(self, trials, **info):
        self.flush()
