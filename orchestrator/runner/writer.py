"""The driver-side Tune callback: the one process that writes the database during a sweep.

Eval rows are buffered and flushed as batched upserts (every ``flush_rows`` rows or
``flush_s`` seconds, and whenever a trial starts, ends or fails). A row lost in the buffer
when the driver dies is not lost for good: the trial's checkpoint holds its trace and the
resumed trial re-reports it. Every write is retried through a database outage
(store.outage): pending rows stay in the buffer until they land. A database that is gone
(file deleted or replaced, tables dropped) is not an outage: the first write that finds it
raises DatabaseGone, the driver session stops every trial, and nothing is written again.

Errors: ``trials.error`` holds one line (exception type and message); each failed
attempt's full traceback goes to ``trial_errors``, and so does that of an exception that
ended a trial in its step (``diverged`` or ``failed`` without a retry, Trainer.step_raised).
The console gets one line per such trial (``on_event``), never the traceback. A trial that fails before its first step
(a configuration error: bad device, a model that cannot be built) reports itself failed
without raising, so Tune does not retry what would fail the same way every time.
"""

from __future__ import annotations

import time
from typing import Any, TYPE_CHECKING

from ray import tune

from orchestrator.status import Status
from orchestrator.store import repo
from orchestrator.store.outage import DatabaseGone, write_with_retry

if TYPE_CHECKING:  # the runner reaches the database only through orchestrator.store
    from sqlalchemy.engine import Engine


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
    return text or "trial failed (no error text recorded by Ray)"


def one_line(text: str) -> str:
    """The exception line of a traceback (``Type: message``), at most 300 characters."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return "error (no text)"
    # Ray wraps the worker's traceback; the last line is the original exception.
    return lines[-1][:300]


def _of(by_tid: dict, tid: int) -> Any:
    """A per-trial entry of a reported result (its keys may have become strings on the way)."""
    return by_tid.get(tid, by_tid.get(str(tid)))


class StoreWriter(tune.Callback):
    def __init__(self, engine: Engine, *, flush_rows: int = 2000, flush_s: float = 0.5, on_event=None, session=None):
        self.engine = engine
        self.flush_rows = flush_rows
        self.flush_s = flush_s
        self.on_event = on_event or (lambda *a, **k: None)
        self.session = session  # DriverSession: the set of running trials it heartbeats
        self._rows: list[dict[str, Any]] = []
        self._touched: set[int] = set()
        self._last_flush = time.monotonic()
        self.rows_written = 0
        self.outcomes: dict[int, str] = {}
        self.gone: DatabaseGone | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its run config (callbacks included) for its own experiment restore,
        # which we never use: an engine and a progress closure cannot travel.
        state = self.__dict__.copy()
        state.update(engine=None, on_event=None, session=None, _rows=[], _touched=set())
        return state

    @staticmethod
    def _tids(trial) -> list[int]:
        """Our trial ids behind one Tune trial (a lone trial, or every member of a pack)."""
        return [int(m["trial_id"]) for m in trial.config["unit"]["members"]]

    def _write(self, fn) -> Any:
        gone = self.gone or (self.session.fatal if self.session is not None else None)
        if gone is not None:
            raise gone  # never write to what is at the database's place now
        try:
            return write_with_retry(self.engine, fn, pin=self.session.pin if self.session is not None else None)
        except DatabaseGone as exc:
            self.gone = exc
            if self.session is not None:
                self.session.fail(exc)
            raise

    def _running(self, tids: list[int], alive: bool) -> None:
        if self.session is not None:
            (self.session.running.update if alive else self.session.running.difference_update)(tids)

    def flush(self) -> None:
        if not self._rows and not self._touched:
            return
        rows, touched = list(self._rows), set(self._touched)

        def write(conn) -> int:
            n = repo.upsert_evals(conn, rows)
            repo.touch(conn, touched)
            return n

        # The buffer is cleared only once the rows are in: an outage keeps them pending.
        self.rows_written += self._write(write)
        del self._rows[: len(rows)]
        self._touched -= touched
        self._last_flush = time.monotonic()

    def on_step_begin(self, iteration, trials, **info):
        # The lease thread found the database gone: end Tune's loop now rather than let
        # each trial run on to its next report.
        if self.session is not None and self.session.fatal is not None:
            raise self.session.fatal

    def on_trial_start(self, iteration, trials, trial, **info):
        self.flush()
        tids = self._tids(trial)

        def write(conn) -> None:
            for tid in tids:
                repo.mark_running(conn, tid)

        self._write(write)
        self._running(tids, True)
        self.on_event("start", trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        evals = result.get("evals") or ()
        self._rows.extend(evals)
        self._touched.update(self._tids(trial))
        placement = result.get("placement")
        if placement:
            self.flush()
            tids = self._tids(trial)

            def write(conn) -> None:
                for tid in tids:
                    repo.set_placement(
                        conn, tid, placement.get("host"), placement.get("node_id"), placement.get("device")
                    )

            self._write(write)
        if len(self._rows) >= self.flush_rows or time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()
        if evals:
            self.on_event("result", trial, step=evals[-1]["step"], evals=evals)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.flush()
        last = trial.last_result or {}
        final = last.get("final") or {}
        tracebacks = last.get("tracebacks") or {}
        kinds = last.get("error_kinds") or {}
        tids = self._tids(trial)
        results: dict[int, tuple[str, str | None, Any]] = {}
        for tid in tids:
            got = final.get(tid) or final.get(str(tid))
            # No final report: Tune stopped the trial (a cancel) before it ended. A third
            # element is the spec's stop rule ending the trial after its escape.
            results[tid] = (
                (got[0], got[1], got[2] if len(got) > 2 else None) if got else (Status.interrupted.value, None, None)
            )

        def write(conn) -> None:
            for tid, (status, error, stopped) in results.items():
                if status == Status.interrupted.value:
                    repo.interrupt_trial(conn, tid)
                    continue
                tb = _of(tracebacks, tid)
                if error and (tb is not None or status == Status.failed.value):
                    repo.add_trial_error(conn, tid, _of(kinds, tid) or "runtime", error, tb)
                repo.finish_trial(conn, tid, status, error)
                if stopped:
                    repo.record_stop(conn, tid, **stopped)

        self._write(write)
        self._running(tids, False)
        for tid, (status, error, _) in results.items():
            self.outcomes[tid] = status
            # An error worth a line of its own: a failure, or an exception that ended the trial.
            raised = status == Status.failed.value or _of(tracebacks, tid) is not None
            self.on_event(status, trial, trial_id=tid, error=error if raised else None)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.flush()
        text = _error_text(trial)
        tids = self._tids(trial)

        def write(conn) -> None:
            for tid in tids:
                repo.add_trial_error(conn, tid, "runtime", one_line(text), text)
                repo.record_error(conn, tid, one_line(text))

        self._write(write)
        self.on_event("retry", trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self.flush()
        text = _error_text(trial)
        tids = self._tids(trial)

        def write(conn) -> None:
            for tid in tids:
                repo.add_trial_error(conn, tid, "runtime", one_line(text), text)
                repo.finish_trial(conn, tid, Status.failed.value, one_line(text))

        self._write(write)
        self._running(tids, False)
        for tid in tids:
            self.outcomes[tid] = Status.failed.value
            self.on_event(Status.failed.value, trial, trial_id=tid, error=one_line(text))

    def on_experiment_end(self, trials, **info):
        self.flush()
